"""TorchAir-style configuration, mapped onto the flat options of :class:`~.config.Config`.

Code written for TorchAir keeps its spelling::

    config = CompilerConfig()
    config.debug.aclgraph.disable_mempool_reuse_in_same_fx = True
    backend = get_npu_backend(compiler_config=config)
    # same as options={"reuse_graph_pool_in_same_fx": False}

Every level rejects names it does not know, on set and on get, so a misspelt option fails where
it is written instead of being silently ignored. Values are validated by ``Config`` itself, in
:meth:`CompilerConfig.to_config` (and therefore in :func:`get_npu_backend`).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from npugraph_ex.config import Config
from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import ConfigError, ConfigTypeError

log = logging.getLogger(__name__)

__all__ = ["CompilerConfig", "ConfiguredBackend", "OptionGroup", "get_npu_backend"]


@dataclass(frozen=True)
class _Leaf:
    """How one TorchAir attribute maps onto a flat option."""

    option: str | None
    """Flat option it sets; None for an attribute that is accepted and only recorded."""

    negate: bool = False
    """True when the TorchAir attribute is the negation of the flat bool option."""

    choices: tuple[str, ...] | None = None
    """Allowed values (besides None) of a recorded-only attribute; None accepts anything."""


_Tree = Mapping[str, Any]
"""Attribute name -> _Leaf, or a nested _Tree for a group of options."""

_ACLGRAPH_REINPLACE: _Tree = {
    "disable_reinplace_inplaceable_ops_pass": _Leaf("inplace_pass", negate=True),
    "disable_reinplace_input_mutated_ops_pass": _Leaf("input_inplace_pass", negate=True),
}

_FLAT_NAMES = (
    "force_eager",
    "force_recapture",
    "capture_limit",
    "clone_input",
    "clone_output",
    "frozen_parameter",
    "use_graph_pool",
    "reuse_graph_pool_in_same_fx",
    "capture_error_mode",
    "static_kernel_compile",
    "disable_static_kernel_compile_cache",
    "remove_noop_ops",
    "remove_cat_ops",
    "inplace_pass",
    "input_inplace_pass",
    "pattern_fusion_pass",
    "dump_tensor_data",
    "data_dump_stage",
    "data_dump_dir",
    "deadlock_check",
    "super_kernel_optimize",
    "super_kernel_optimize_options",
    "super_kernel_debug_options",
)
"""Options TorchAir's own ``npugraph_ex.CompilerConfig`` sets by their flat names."""

_GRAPH_DUMP_TYPE = _Leaf(None, choices=("py",))
"""npugraph_ex dumps FX graphs as Python; TorchAir's ``txt``/``pbtxt`` are graph-engine formats
(its aclgraph mode refuses them too)."""

_TREE: _Tree = {
    "mode": _Leaf("mode"),
    "post_grad_custom_pre_pass": _Leaf("post_grad_custom_pre_pass"),
    "post_grad_custom_post_pass": _Leaf("post_grad_custom_post_pass"),
    **{name: _Leaf(name) for name in _FLAT_NAMES},
    "_vllm_aclnn_static_kernel_sym_index": _Leaf(None),
    "_vllm_aclnn_static_kernel_sym_range": _Leaf(None),
    "debug": {
        "run_eagerly": _Leaf("force_eager"),
        "deadlock_check": _Leaf("deadlock_check"),
        "aclgraph": {
            "clone_input": _Leaf("clone_input"),
            **_ACLGRAPH_REINPLACE,
            "disable_mempool_reuse_in_same_fx": _Leaf("reuse_graph_pool_in_same_fx", negate=True),
            "static_capture_size_limit": _Leaf("capture_limit"),
            "enable_output_clone": _Leaf("clone_output"),
            "remove_cat_ops": _Leaf("remove_cat_ops"),
        },
        "graph_dump": {
            "type": _GRAPH_DUMP_TYPE,
            "path": _Leaf("debug_dump_dir"),
        },
        "data_dump": {
            "type": _Leaf(None, choices=("npy",)),
            "filter": _Leaf(None),
            "path": _Leaf(None),
        },
        "fx_summary": {
            "type": _Leaf(None, choices=("csv",)),
            "skip_compile": _Leaf(None),
        },
    },
    "experimental_config": {
        "frozen_parameter": _Leaf("frozen_parameter"),
        "remove_noop_ops": _Leaf("remove_noop_ops"),
        "pattern_fusion_pass": _Leaf("pattern_fusion_pass"),
        "aclgraph": {
            "_aclnn_static_shape_kernel": _Leaf("static_kernel_compile"),
            "_aclnn_static_shape_kernel_build_dir": _Leaf(None),
            "_aclnn_static_shape_kernel_sym_value_range": _Leaf(None),
            "_aclnn_static_shape_kernel_sym_index": _Leaf(None),
            "_super_kernel_optimize": _Leaf("super_kernel_optimize"),
            "_super_kernel_optimize_options": _Leaf("super_kernel_optimize_options"),
            "_super_kernel_debug_options": _Leaf("super_kernel_debug_options"),
        },
    },
    "aclgraph_config": {
        "use_custom_pool": _Leaf("use_graph_pool"),
        **_ACLGRAPH_REINPLACE,
    },
    "dump_config": {
        "enable_dump": _Leaf("dump_tensor_data"),
        "dump_path": _Leaf("data_dump_dir"),
        "dump_step": _Leaf("data_dump_calls"),
        "dump_layer": _Leaf("data_dump_nodes"),
    },
}

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}
_INTERNAL = frozenset({"_path", "_spec", "_values", "_groups"})


def _leaf_default(leaf: _Leaf) -> Any:
    if leaf.option is None:
        return None
    default = _DEFAULTS[leaf.option]
    return not default if leaf.negate else default


class OptionGroup:
    """One level of TorchAir's nested config; unknown names raise AttributeError."""

    __slots__ = ("_groups", "_path", "_spec", "_values")

    def __init__(self, path: str, spec: _Tree) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_values", {})
        groups = {
            name: OptionGroup(f"{path}.{name}", sub)
            for name, sub in spec.items()
            if not isinstance(sub, _Leaf)
        }
        object.__setattr__(self, "_groups", groups)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails; internal slots missing means a half-built
        # object (copy, pickle), which must not recurse into the lookups below.
        if name in _INTERNAL:
            raise AttributeError(name)
        if name in self._groups:
            return self._groups[name]
        leaf = self._spec.get(name)
        if not isinstance(leaf, _Leaf):
            raise self._unknown(name)
        return self._values.get(name, _leaf_default(leaf))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _INTERNAL:  # copy and pickle restore the slots through setattr
            object.__setattr__(self, name, value)
            return
        leaf = self._spec.get(name)
        if name in self._groups:
            raise AttributeError(
                f"{self._path}.{name} is a group of options and cannot be assigned; set its "
                f"fields instead, e.g. {self._path}.{name}.{next(iter(self._spec[name]))}"
            )
        if not isinstance(leaf, _Leaf):
            raise self._unknown(name)
        if leaf is _GRAPH_DUMP_TYPE and value is not None and value != "py":
            raise ConfigError(
                f"{self._path}.{name} must be 'py' (npugraph_ex dumps each FX graph as Python; "
                f"'txt' and 'pbtxt' are TorchAir's graph-engine formats), got {value!r}"
            )
        if leaf.choices is not None and value is not None and value not in leaf.choices:
            allowed = ", ".join(repr(choice) for choice in leaf.choices)
            raise ConfigError(f"{self._path}.{name} must be one of {allowed}, got {value!r}")
        self._values[name] = value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._spec))

    def __repr__(self) -> str:
        items = ", ".join(f"{name}={value!r}" for name, _, value in self._set_leaves())
        return f"{type(self).__name__}({items})"

    def _unknown(self, name: str) -> AttributeError:
        valid = sorted(self._spec)
        message = f"{self._path} has no option {name!r}"
        close = difflib.get_close_matches(name, valid, n=1)
        message += f"; did you mean {close[0]!r}?" if close else "."
        return AttributeError(f"{message} Valid names here: {', '.join(valid)}")

    def _set_leaves(self, prefix: str = "") -> Iterator[tuple[str, _Leaf, Any]]:
        """Yield (dotted TorchAir name, leaf, value) for every attribute the user set."""
        for name, sub in self._spec.items():
            if isinstance(sub, _Leaf):
                if name in self._values:
                    yield prefix + name, sub, self._values[name]
            else:
                yield from self._groups[name]._set_leaves(f"{prefix}{name}.")


class CompilerConfig(OptionGroup):
    """TorchAir's ``CompilerConfig``, turned into npugraph_ex options by :meth:`to_options`."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("CompilerConfig()", _TREE)

    def to_options(self) -> dict[str, Any]:
        """Return the flat options for the attributes that were set."""
        return self._collect()[0]

    def to_config(self) -> Config:
        """Return the validated Config; raises ConfigError naming the TorchAir spelling."""
        options, spellings = self._collect()
        try:
            return Config.from_options(options)
        except ConfigError as e:
            spelling = spellings.get(e.option or "")
            if spelling is not None and sys.version_info >= (3, 11):
                e.add_note(f"(set as CompilerConfig().{spelling})")
            raise

    def _collect(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Return (flat options, flat option name -> TorchAir spelling that set it)."""
        options: dict[str, Any] = {}
        spellings: dict[str, str] = {}
        for spelling, leaf, value in self._set_leaves():
            if leaf.option is None:
                continue
            if leaf.negate and not isinstance(value, bool):
                raise ConfigTypeError(
                    f"CompilerConfig().{spelling} must be a bool (True or False), got {value!r}",
                    option=leaf.option,
                )
            mapped = not value if leaf.negate else value
            if leaf.option in options and options[leaf.option] != mapped:
                raise ConfigError(
                    f"CompilerConfig().{spelling} conflicts with "
                    f"CompilerConfig().{spellings[leaf.option]}: both set option "
                    f"{leaf.option!r}, to different values; set only one of them",
                    option=leaf.option,
                )
            options[leaf.option] = mapped
            spellings[leaf.option] = spelling
        return options, spellings


def get_npu_backend(
    *,
    compiler_config: CompilerConfig | None = None,
    custom_decompositions: Mapping[Any, Any] | None = None,
) -> Callable[..., Any]:
    """Return a ``torch.compile`` backend configured by a TorchAir-style ``CompilerConfig``.

    The options are validated here, so a bad value fails at this call rather than at the first
    compile. Custom decompositions are not supported: rewrite the graph in a
    ``post_grad_custom_pre_pass`` instead.
    """
    if custom_decompositions is not None and not isinstance(custom_decompositions, dict):
        raise ConfigTypeError(
            "custom_decompositions must be a dict or None, "
            f"got {type(custom_decompositions).__name__}"
        )
    if custom_decompositions:
        raise ConfigError(
            f"custom_decompositions are not supported, got {len(custom_decompositions)} "
            "entries; leave it empty and rewrite the graph in "
            "CompilerConfig().post_grad_custom_pre_pass instead"
        )
    if compiler_config is None:
        compiler_config = CompilerConfig()
    elif not isinstance(compiler_config, CompilerConfig):
        raise ConfigTypeError(
            "compiler_config must be a CompilerConfig or None, "
            f"got {type(compiler_config).__name__}"
        )
    compiler_config.to_config()
    return ConfiguredBackend(compiler_config.to_options())


class ConfiguredBackend:
    """The backend with a ``CompilerConfig``'s options, merged with ``torch.compile(...,
    options=...)``.

    ``torch.compile`` passes its ``options`` to the backend on every compile; they are added to
    the config's. An option set both ways to different values takes the ``options=`` value, the
    one written at the call, and a one-time warning names it with both values.
    """

    __name__ = "npugraph_ex"

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)

    def __call__(
        self,
        gm: Any,
        example_inputs: Any,
        *,
        options: Mapping[str, Any] | None = None,
        mode: str | None = None,
    ) -> Any:
        # Imported here: the backend module imports the compiler stack, which imports this one.
        from npugraph_ex.dynamo_backend import npugraph_ex_backend

        return npugraph_ex_backend(
            gm, example_inputs, options=self.merged(options or {}), mode=mode
        )

    def merged(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The config's options updated with ``options``, warning once per conflict."""
        for name, value in options.items():
            if name in self.options and self.options[name] != value:
                log_once(
                    log,
                    logging.WARNING,
                    ("options= overrides CompilerConfig", name, repr(value)),
                    "torch.compile(options={%r: %r}) overrides the CompilerConfig's %s=%r; "
                    "set it in one place only",
                    name,
                    value,
                    name,
                    self.options[name],
                )
        return {**self.options, **options}
