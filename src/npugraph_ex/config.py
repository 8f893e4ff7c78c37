"""Options of the npugraph_ex backend, validated once into a frozen :class:`Config`.

``torch.compile(backend="npugraph_ex", options={...})`` hands a plain dict to the backend;
:meth:`Config.from_options` turns it into a ``Config`` or raises a
:class:`~npugraph_ex.errors.ConfigError` that names the option, the value found and what is
allowed. Validation lives in ``__post_init__``, so ``dataclasses.replace`` validates too, and a
``Config`` that exists is always valid.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from npugraph_ex.errors import ConfigError, ConfigTypeError
from npugraph_ex.option_checks import (
    MODE_ALIASES,
    check_bool,
    check_build_steps,
    check_callable,
    check_calls,
    check_choice,
    check_decompositions,
    check_dict,
    check_gain,
    check_int,
    check_int_values,
    check_kernel_tier,
    check_mode,
    check_names,
    check_optional_path,
    check_path,
    check_patterns,
    check_pool,
    checked_field,
)

__all__ = ["OPTION_ALIASES", "OPTION_NAMES", "Config"]

logger = logging.getLogger(__name__)

_ASCEND_ONLY = (
    "super_kernel_optimize",
    "super_kernel_optimize_options",
    "super_kernel_debug_options",
)
_NOT_HASHED = frozenset({"use_graph_pool", "data_dump_dir", "debug_dump_dir"})
_logged_once: set[str] = set()


@dataclass(frozen=True, kw_only=True)
class Config:
    """Every option of the npugraph_ex backend; build with :meth:`from_options`.

    Invariant: every field holds a validated value of its declared type, because
    ``__post_init__`` runs for the constructor and for ``dataclasses.replace`` alike.
    """

    mode: str = checked_field("npugraph_ex", check_mode)
    """One of 'npugraph_ex', 'max-autotune'; 'reduce-overhead' (TorchAir's older name of this
    mode, and Hugging Face's default) is stored as 'npugraph_ex'."""

    force_eager: bool = checked_field(False, check_bool)
    """Run every graph eagerly without capturing it (for debugging)."""

    force_recapture: bool = checked_field(False, check_bool)
    """Capture again on every call instead of replaying a captured graph."""

    capture_limit: int = checked_field(64, check_int(1))
    """Most graphs captured per FX graph (one per distinct input shape) before running eagerly."""

    clone_input: bool = checked_field(True, check_bool)
    """Copy user inputs into the captured graph's static input buffers before each replay."""

    clone_output: bool = checked_field(False, check_bool)
    """Return clones of the outputs, so the next replay cannot overwrite what a caller holds."""

    frozen_parameter: bool = checked_field(False, check_bool)
    """Treat parameters and buffers as constant: their addresses are not checked again."""

    use_graph_pool: Any = checked_field(None, check_pool)
    """Memory pool handle shared by every FX graph compiled with these options (for example
    ``torch.cuda.graph_pool_handle()``); None gives each FX graph its own pool."""

    reuse_graph_pool_in_same_fx: bool = checked_field(True, check_bool)
    """Let the graphs captured for one FX graph (one per shape) share a single memory pool."""

    capture_error_mode: str = checked_field(
        "global", check_choice(("global", "thread_local", "relaxed"))
    )
    """Graph capture mode on CUDA/NPU (which unsafe calls from other threads abort a capture);
    on CPU, 'global' serialises captures across threads and the other two modes do not."""

    num_warmup_iters: int = checked_field(1, check_int(0))
    """Eager runs before each capture, inside the capturing call, so that lazily initialised
    library state exists; the writes they make to inputs are undone before capture."""

    static_kernel_compile: bool | str | None = checked_field(None, check_kernel_tier)
    """Compile kernels for the static shapes of a captured graph: True, before its first replay;
    ``"background"``, once the key is hot, in a compile process, swapped in at a call boundary,
    checked against the ATen replay and kept only where faster (``kernels/tier.py``,
    ``capture/tiers.py``); False, never (the ATen replay, bit for bit eager). None, the default:
    what the device's platform answers (``Platform.kernel_tier``): ``"background"`` on CPU,
    False on CUDA and NPU, and False wherever ``dump_tensor_data`` is on."""

    background_compile_after: int = checked_field(8, check_int(1))
    """With ``static_kernel_compile="background"``: replays of a key before its kernels are
    compiled (a key called fewer times never pays for a compile)."""

    background_compiles_in_flight: int = checked_field(1, check_int(1))
    """With ``static_kernel_compile="background"``: compiles running at once (each a worker
    process); hot keys beyond them wait for a free one."""

    background_min_gain: float = checked_field(1.0, check_gain)
    """With ``static_kernel_compile="background"``: how much faster (median over real calls) a
    key's compiled kernels must be than its ATen replay to be kept; else the ATen replay stays."""

    background_cores: int = checked_field(1, check_int(0))
    """With ``static_kernel_compile="background"``: cores given to background compiles while
    they run (the compile process and the kernels' first run pinned to the last ones; replays
    of the graph's keys use fewer intra-op threads meanwhile); 0 shares every core."""

    background_compile_seconds: float = checked_field(600.0, check_gain)
    """With ``static_kernel_compile="background"``: the longest a compile may take; a compile
    process that has not answered by then is killed, the key keeps its ATen replay (one
    warning), and the next compile starts a new process."""

    disable_static_kernel_compile_cache: bool = checked_field(False, check_bool)
    """Compile static kernels afresh instead of reusing the on-disk cache."""

    static_kernel_sym_index: int = checked_field(0, check_int(0))
    """Which int input of a graph (its symbolic sizes, in order) ``static_kernel_sym_values``
    looks at; TorchAir's ``_vllm_aclnn_static_kernel_sym_index``."""

    static_kernel_sym_values: tuple[int, ...] | None = checked_field(None, check_int_values)
    """The values of that int for which a key gets static kernels; None: every key. TorchAir's
    ``_vllm_aclnn_static_kernel_sym_range`` (a list of values, not a range); stored as a
    tuple."""

    remove_noop_ops: bool = checked_field(True, check_bool)
    """Run the pass that removes ops which return their input unchanged."""

    remove_cat_ops: bool = checked_field(True, check_bool)
    """Run the pass that removes cat ops whose result can be written in place."""

    inplace_pass: bool = checked_field(True, check_bool)
    """Run the pass that turns out-of-place ops back into their in-place forms."""

    input_inplace_pass: bool = checked_field(True, check_bool)
    """Run the pass that writes input mutations in place instead of copying back."""

    pattern_fusion_pass: bool = checked_field(True, check_bool)
    """Run the pass that replaces known op patterns with fused kernels."""

    post_grad_custom_pre_pass: Callable[..., Any] | None = checked_field(None, check_callable)
    """Called with the FX graph before the built-in passes; None for none."""

    post_grad_custom_post_pass: Callable[..., Any] | None = checked_field(None, check_callable)
    """Called with the FX graph after the built-in passes; None for none."""

    custom_decompositions: dict[Any, Callable[..., Any]] | None = checked_field(
        None, check_decompositions
    )
    """ATen op -> a function computing it from other ops, applied while AOTAutograd traces the
    graph; an overload packet (``aten.gelu``) stands for all its overloads. An empty dict is
    stored as None."""

    dump_tensor_data: bool = checked_field(False, check_bool)
    """Write the tensors flowing through the graph to ``data_dump_dir``."""

    data_dump_stage: str = checked_field("optimized", check_choice(("original", "optimized")))
    """Which graph to dump tensors from: before ('original') or after ('optimized') passes."""

    data_dump_dir: str = checked_field("./", check_path)
    """Existing folder for tensor dumps; an os.PathLike is stored as str."""

    data_dump_nodes: tuple[str, ...] = checked_field((), check_patterns)
    """Dump only nodes whose name or op matches one of these shell patterns (``"aten.mm.*"``,
    ``"mul_*"``); a str is split at whitespace; empty dumps every node."""

    data_dump_calls: str = checked_field("", check_calls)
    """Dump only these calls of each graph, counted from 0: ``"0|2-4"``; empty dumps every call."""

    deadlock_check: bool = checked_field(False, check_bool)
    """Check for collective-communication deadlocks while capturing."""

    super_kernel_optimize: bool = checked_field(False, check_bool)
    """Ascend only: fuse the kernels of a captured graph into super kernels."""

    super_kernel_optimize_options: dict[str, Any] | None = checked_field(None, check_dict)
    """Ascend only: options of the super kernel fusion."""

    super_kernel_debug_options: dict[str, Any] | None = checked_field(None, check_dict)
    """Ascend only: debug options of the super kernel fusion."""

    strict_capture: bool = checked_field(False, check_bool)
    """Raise UnsupportedGraphError for a graph that cannot be captured, instead of running it
    eagerly."""

    strict_passes: bool = checked_field(False, check_bool)
    """Raise PassError when a pass fails, instead of warning and going on with the graph as it
    was before that pass."""

    disabled_passes: tuple[str, ...] = checked_field((), check_names)
    """Names of passes to skip, to bisect a miscompile; a list is stored as a tuple."""

    disabled_build_steps: tuple[str, ...] = checked_field((), check_build_steps)
    """Steps of the CPU replay engine's build to skip, for comparisons: ``fold_constants``
    (replay every step), ``place`` (no pool: every storage keeps its own allocation),
    ``share_views`` (each recorded tensor object kept)."""

    debug_dump_dir: str | None = checked_field(None, check_optional_path)
    """Folder for the FX graph before and after each pass; None writes nothing."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            checked = f.metadata["check"](f.name, value)
            if checked is not value:
                object.__setattr__(self, f.name, checked)
        if self.dump_tensor_data and not os.path.isdir(self.data_dump_dir):
            options = {"dump_tensor_data": True, "data_dump_dir": self.data_dump_dir}
            raise ConfigError(
                f"data_dump_dir must be an existing directory when dump_tensor_data is True, "
                f"got {self.data_dump_dir!r} (options={options!r}); create it first, e.g. "
                f"os.makedirs({self.data_dump_dir!r})",
                option="data_dump_dir",
            )
        self._warn_ascend_only()

    def static_kernels_for(self, ints: Sequence[int]) -> bool:
        """Whether a key whose graph gets ``ints`` as its int inputs (in order) is one that
        ``static_kernel_sym_index``/``static_kernel_sym_values`` choose for static kernels.

        TorchAir's rule: every key when no values are given; else the key's int at the index
        must be one of them, and an index past the graph's ints chooses no key.
        """
        values = self.static_kernel_sym_values
        if values is None:
            return True
        index = self.static_kernel_sym_index
        return index < len(ints) and ints[index] in values

    def _warn_ascend_only(self) -> None:
        set_names = [name for name in _ASCEND_ONLY if not _is_default(self, name)]
        if set_names and "ascend_only" not in _logged_once:
            _logged_once.add("ascend_only")
            logger.warning(
                "Ascend-only options have no effect on this device and are ignored: %s "
                "(logged once)",
                ", ".join(set_names),
            )

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any] | None = None, *, mode: str | None = None
    ) -> Config:
        """Build a Config from ``torch.compile``'s ``options`` dict and ``mode`` string.

        TorchAir's flat names in :data:`OPTION_ALIASES` are accepted for the options they name.
        Raises ConfigError for an unknown option or a ``mode`` that disagrees with
        ``options['mode']``, and ConfigTypeError when ``options`` is not a mapping.
        """
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigTypeError(
                f"options must be a dict of option names to values, got {type(options).__name__}"
            )
        merged = {}
        for name, value in options.items():
            if name in OPTION_ALIASES:
                name = _alias(name, value, options)
            elif name not in OPTION_NAMES:
                _unknown_option(name, value)
            merged[name] = value
        if mode is not None:
            if "mode" in merged and not _same_mode(merged["mode"], mode):
                raise ConfigError(
                    f"mode={mode!r} conflicts with options['mode']={merged['mode']!r}; give "
                    "the mode once, either as torch.compile(mode=...) or in options",
                    option="mode",
                )
            merged.setdefault("mode", mode)
        return cls(**merged)

    def compute_hash(self) -> str:
        """Return a sha256 hex digest of the options that change compiled artifacts.

        Stable across processes: callables count by module and qualified name, dicts by their
        sorted items. ``use_graph_pool``, ``data_dump_dir`` and ``debug_dump_dir`` are left out
        because they change where memory or files go, not what is compiled.
        """
        parts = [
            f"{f.name}={_canonical(getattr(self, f.name))}"
            for f in dataclasses.fields(self)
            if f.name not in _NOT_HASHED
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def to_options(self) -> dict[str, Any]:
        """Return the options that differ from their defaults, as ``from_options`` takes them."""
        options = {}
        for name in OPTION_NAMES:
            if not _is_default(self, name):
                value = getattr(self, name)
                options[name] = dict(value) if isinstance(value, dict) else value
        return options


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config))
"""Every option name, in declaration order."""

OPTION_ALIASES: dict[str, str] = {
    "_vllm_aclnn_static_kernel_sym_index": "static_kernel_sym_index",
    "_vllm_aclnn_static_kernel_sym_range": "static_kernel_sym_values",
}
"""TorchAir's flat names of options that have a name of their own here."""

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}
_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _is_default(config: Config, name: str) -> bool:
    value, default = getattr(config, name), _DEFAULTS[name]
    return value is default or (type(value) is type(default) and value == default)


def _same_mode(a: Any, b: Any) -> bool:
    if not isinstance(a, str) or not isinstance(b, str):
        return a == b
    return MODE_ALIASES.get(a, a) == MODE_ALIASES.get(b, b)


def _alias(alias: str, value: Any, options: Mapping[str, Any]) -> str:
    """The option ``alias`` names, after checking ``value`` under the name the user wrote."""
    name = OPTION_ALIASES[alias]
    check = _FIELDS[name].metadata["check"]
    checked = check(alias, value)
    if name in options and check(name, options[name]) != checked:
        raise ConfigError(
            f"{alias}={value!r} conflicts with {name}={options[name]!r}: both name option "
            f"{name!r}; give it once",
            option=name,
        )
    return name


def _unknown_option(name: Any, value: Any) -> NoReturn:
    options = {name: value}
    message = f"unknown option {name!r} (options={options!r})"
    close = difflib.get_close_matches(str(name), (*OPTION_NAMES, *OPTION_ALIASES), n=1)
    message += f"; did you mean {close[0]!r}?" if close else "."
    raise ConfigError(f"{message} Valid options: {', '.join(sorted(OPTION_NAMES))}")


def _canonical(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{k!r}: {_canonical(v)}" for k, v in value.items())) + "}"
    if callable(value):
        value = inspect.unwrap(value)  # a wrapper of the user's function hashes as it does
        target = value if hasattr(value, "__qualname__") else type(value)
        return f"<callable {target.__module__}.{target.__qualname__}>"
    return repr(value)
