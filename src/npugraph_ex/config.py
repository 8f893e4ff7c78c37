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
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from npugraph_ex.debug.calls import parse_calls
from npugraph_ex.errors import ConfigError, ConfigTypeError

__all__ = ["OPTION_NAMES", "Config"]

logger = logging.getLogger(__name__)

_Check = Callable[[str, Any], Any]
"""Validates ``value`` for option ``name`` and returns the value to store, or raises."""

_MODES = ("npugraph_ex", "reduce-overhead", "max-autotune")
_MODE_ALIASES = {"reduce-overhead": "npugraph_ex"}
_ASCEND_ONLY = (
    "super_kernel_optimize",
    "super_kernel_optimize_options",
    "super_kernel_debug_options",
)
_NOT_HASHED = frozenset({"use_graph_pool", "data_dump_dir", "debug_dump_dir"})
_NOT_A_POOL = (str, bytes, bool, int, float, list, dict, set)
_logged_once: set[str] = set()


def _fail(name: str, allowed: str, value: Any, error: type[ConfigError] = ConfigError) -> NoReturn:
    options = {name: value}
    raise error(f"{name} must be {allowed}, got {value!r} (options={options!r})", option=name)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(name, "a bool (True or False)", value, ConfigTypeError)
    return value


def _check_int(minimum: int) -> _Check:
    allowed = f"an int >= {minimum}"

    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(name, allowed, value, ConfigTypeError)
        if value < minimum:
            _fail(name, allowed, value)
        return value

    return check


def _check_choice(choices: tuple[str, ...]) -> _Check:
    allowed = "one of " + ", ".join(repr(choice) for choice in choices)

    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            _fail(name, allowed, value, ConfigTypeError)
        if value not in choices:
            _fail(name, allowed, value)
        return value

    return check


def _check_mode(name: str, value: Any) -> str:
    value = _check_choice(_MODES)(name, value)
    if value in _MODE_ALIASES:
        new = _MODE_ALIASES[value]
        warnings.warn(
            f"mode={value!r} is deprecated; it means {new!r} here. "
            f"Pass mode={new!r} (or leave mode unset) to silence this warning.",
            FutureWarning,
            stacklevel=4,
        )
        return new
    return value


def _check_callable(name: str, value: Any) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        _fail(name, "a callable taking the FX graph, or None", value, ConfigTypeError)
    return value


def _check_dict(name: str, value: Any) -> dict[Any, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        _fail(name, "a dict or None", value, ConfigTypeError)
    return dict(value)  # a private copy: the caller mutating theirs must not change a Config


def _check_pool(name: str, value: Any) -> Any:
    if isinstance(value, _NOT_A_POOL):
        allowed = "a graph pool handle (e.g. torch.cuda.graph_pool_handle()) or None"
        _fail(name, allowed, value, ConfigTypeError)
    return value


def _check_path(name: str, value: Any) -> str:
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str):
        _fail(name, "a str or os.PathLike", value, ConfigTypeError)
    return path


def _check_optional_path(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not isinstance(os.fspath(value), str):
        _fail(name, "a str, os.PathLike or None", value, ConfigTypeError)
    return os.fspath(value)


def _check_names(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        _fail(name, "a list or tuple of pass names (str)", value, ConfigTypeError)
    return tuple(value)


def _check_patterns(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(value.split())
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        _fail(name, "a list or tuple of patterns (str), or one str of them", value, ConfigTypeError)
    return tuple(value)


def _check_calls(name: str, value: Any) -> str:
    if not isinstance(value, str):
        _fail(name, "a str of calls such as '0|2-4'", value, ConfigTypeError)
    try:
        parse_calls(value)
    except ValueError as error:
        _fail(name, f"calls such as '0|2-4' ({error})", value)
    return value


def _option(default: Any, check: _Check) -> Any:
    return field(default=default, metadata={"check": check})


@dataclass(frozen=True, kw_only=True)
class Config:
    """Every option of the npugraph_ex backend; build with :meth:`from_options`.

    Invariant: every field holds a validated value of its declared type, because
    ``__post_init__`` runs for the constructor and for ``dataclasses.replace`` alike.
    """

    mode: str = _option("npugraph_ex", _check_mode)
    """One of 'npugraph_ex', 'max-autotune'; 'reduce-overhead' is a deprecated alias of
    'npugraph_ex' and is stored as 'npugraph_ex'."""

    force_eager: bool = _option(False, _check_bool)
    """Run every graph eagerly without capturing it (for debugging)."""

    force_recapture: bool = _option(False, _check_bool)
    """Capture again on every call instead of replaying a captured graph."""

    capture_limit: int = _option(64, _check_int(1))
    """Most graphs captured per FX graph (one per distinct input shape) before running eagerly."""

    clone_input: bool = _option(True, _check_bool)
    """Copy user inputs into the captured graph's static input buffers before each replay."""

    clone_output: bool = _option(False, _check_bool)
    """Return clones of the outputs, so the next replay cannot overwrite what a caller holds."""

    frozen_parameter: bool = _option(False, _check_bool)
    """Treat parameters and buffers as constant: their addresses are not checked again."""

    use_graph_pool: Any = _option(None, _check_pool)
    """Memory pool handle shared by every FX graph compiled with these options (for example
    ``torch.cuda.graph_pool_handle()``); None gives each FX graph its own pool."""

    reuse_graph_pool_in_same_fx: bool = _option(True, _check_bool)
    """Let the graphs captured for one FX graph (one per shape) share a single memory pool."""

    capture_error_mode: str = _option(
        "global", _check_choice(("global", "thread_local", "relaxed"))
    )
    """Graph capture mode on CUDA/NPU (which unsafe calls from other threads abort a capture);
    on CPU, 'global' serialises captures across threads and the other two modes do not."""

    num_warmup_iters: int = _option(1, _check_int(0))
    """Eager runs before each capture, inside the capturing call, so that lazily initialised
    library state exists; the writes they make to inputs are undone before capture."""

    static_kernel_compile: bool = _option(False, _check_bool)
    """Compile kernels for the static shapes of a captured graph."""

    disable_static_kernel_compile_cache: bool = _option(False, _check_bool)
    """Compile static kernels afresh instead of reusing the on-disk cache."""

    remove_noop_ops: bool = _option(True, _check_bool)
    """Run the pass that removes ops which return their input unchanged."""

    remove_cat_ops: bool = _option(True, _check_bool)
    """Run the pass that removes cat ops whose result can be written in place."""

    inplace_pass: bool = _option(True, _check_bool)
    """Run the pass that turns out-of-place ops back into their in-place forms."""

    input_inplace_pass: bool = _option(True, _check_bool)
    """Run the pass that writes input mutations in place instead of copying back."""

    pattern_fusion_pass: bool = _option(True, _check_bool)
    """Run the pass that replaces known op patterns with fused kernels."""

    post_grad_custom_pre_pass: Callable[..., Any] | None = _option(None, _check_callable)
    """Called with the FX graph before the built-in passes; None for none."""

    post_grad_custom_post_pass: Callable[..., Any] | None = _option(None, _check_callable)
    """Called with the FX graph after the built-in passes; None for none."""

    dump_tensor_data: bool = _option(False, _check_bool)
    """Write the tensors flowing through the graph to ``data_dump_dir``."""

    data_dump_stage: str = _option("optimized", _check_choice(("original", "optimized")))
    """Which graph to dump tensors from: before ('original') or after ('optimized') passes."""

    data_dump_dir: str = _option("./", _check_path)
    """Existing folder for tensor dumps; an os.PathLike is stored as str."""

    data_dump_nodes: tuple[str, ...] = _option((), _check_patterns)
    """Dump only nodes whose name or op matches one of these shell patterns (``"aten.mm.*"``,
    ``"mul_*"``); a str is split at whitespace; empty dumps every node."""

    data_dump_calls: str = _option("", _check_calls)
    """Dump only these calls of each graph, counted from 0: ``"0|2-4"``; empty dumps every call."""

    deadlock_check: bool = _option(False, _check_bool)
    """Check for collective-communication deadlocks while capturing."""

    super_kernel_optimize: bool = _option(False, _check_bool)
    """Ascend only: fuse the kernels of a captured graph into super kernels."""

    super_kernel_optimize_options: dict[str, Any] | None = _option(None, _check_dict)
    """Ascend only: options of the super kernel fusion."""

    super_kernel_debug_options: dict[str, Any] | None = _option(None, _check_dict)
    """Ascend only: debug options of the super kernel fusion."""

    strict_capture: bool = _option(False, _check_bool)
    """Raise UnsupportedGraphError for a graph that cannot be captured, instead of running it
    eagerly."""

    strict_passes: bool = _option(False, _check_bool)
    """Raise PassError when a pass fails, instead of warning and going on with the graph as it
    was before that pass."""

    disabled_passes: tuple[str, ...] = _option((), _check_names)
    """Names of passes to skip, to bisect a miscompile; a list is stored as a tuple."""

    debug_dump_dir: str | None = _option(None, _check_optional_path)
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

        Raises ConfigError for an unknown option or a ``mode`` that disagrees with
        ``options['mode']``, and ConfigTypeError when ``options`` is not a mapping.
        """
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigTypeError(
                f"options must be a dict of option names to values, got {type(options).__name__}"
            )
        merged = dict(options)
        for name, value in merged.items():
            if name not in OPTION_NAMES:
                _unknown_option(name, value)
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

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}


def _is_default(config: Config, name: str) -> bool:
    value, default = getattr(config, name), _DEFAULTS[name]
    return value is default or (type(value) is type(default) and value == default)


def _same_mode(a: Any, b: Any) -> bool:
    if not isinstance(a, str) or not isinstance(b, str):
        return a == b
    return _MODE_ALIASES.get(a, a) == _MODE_ALIASES.get(b, b)


def _unknown_option(name: Any, value: Any) -> NoReturn:
    options = {name: value}
    message = f"unknown option {name!r} (options={options!r})"
    close = difflib.get_close_matches(str(name), OPTION_NAMES, n=1)
    message += f"; did you mean {close[0]!r}?" if close else "."
    raise ConfigError(f"{message} Valid options: {', '.join(sorted(OPTION_NAMES))}")


def _canonical(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{k!r}: {_canonical(v)}" for k, v in value.items())) + "}"
    if callable(value):
        target = value if hasattr(value, "__qualname__") else type(value)
        return f"<callable {target.__module__}.{target.__qualname__}>"
    return repr(value)
