"""Every field of TorchAir's ``CompilerConfig`` and what it does here.

Two TorchAir classes share the name. ``torchair.CompilerConfig`` nests its options in groups
(``config.debug.aclgraph.clone_input``) and reads bools as ``"1"``/``"0"``;
``npugraph_ex.CompilerConfig`` (TorchAir's standalone package) spells the same options flat
(``config.clone_input``) and reads bools as bools. Both spellings live in one tree here, since no
name means one thing in one and another thing in the other.

A field either sets flat options of :class:`~npugraph_ex.config.Config` (``sets``), or means
nothing off Ascend's graph engine: it is accepted with TorchAir's checks and, when set to
anything but its default, named in one warning when the backend is built.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from npugraph_ex.config import Config
from npugraph_ex.torchair_compat.values import (
    ANY,
    BOOL,
    DICT,
    FUNCTION,
    INT_LIST,
    PLAIN,
    REAL_PATH,
    TEXT,
    Kind,
    choice,
    int_range,
)

__all__ = ["FLAT_NAMES", "TREE", "Field", "Tree"]

CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}


@dataclass(frozen=True)
class Field:
    """One attribute of the tree."""

    kind: Kind
    default: Any = None
    """TorchAir's default (npugraph_ex's for ``mode``, see docs/options.md)."""
    sets: Callable[[Any], dict[str, Any]] | None = None
    """The flat options a value sets; None for a field that means nothing here."""
    reads: Callable[[Config], Any] | None = None
    """The field's value under a Config, as a custom pass reads it; None: as assigned."""
    fills: bool = False
    """Sets only the options that no other field set (it stands for a default of TorchAir's
    that other fields refine)."""
    note: str = ""
    """Why a field that means nothing here does nothing; said in the warning."""
    unused: Callable[[Any], bool] | None = None
    """For a field that sets options: values that still do nothing here (warned about)."""

    def is_unused(self, value: Any) -> bool:
        """Whether ``value`` in this field is one the warning names."""
        if self.unused is not None:
            return self.unused(value)
        return self.sets is None and not same(value, self.default)


Tree = Mapping[str, Any]
"""Attribute name -> Field, or a nested Tree for a group of options."""


def same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def to(option: str, kind: Kind, *, negate: bool = False) -> Field:
    """A field that sets ``option`` (to its negation when ``negate``); its default is the
    option's."""
    default = CONFIG_DEFAULTS[option]
    if negate:
        return Field(
            kind,
            not default,
            sets=lambda value: {option: not value},
            reads=lambda config: not getattr(config, option),
        )
    return Field(
        kind,
        default,
        sets=lambda value: {option: value},
        reads=lambda config: getattr(config, option),
    )


def nothing(kind: Kind, default: Any = None, note: str = "") -> Field:
    """A field that means nothing off Ascend's graph engine."""
    return Field(kind, default, note=note)


def custom_pass(option: str) -> Field:
    """A custom pass: read back as the user's function, not the backend's wrapper of it."""
    return Field(
        FUNCTION,
        sets=lambda fn: {option: fn},
        reads=lambda config: inspect.unwrap(getattr(config, option)),
    )


def set_unless_none(option: str, value: Any) -> dict[str, Any]:
    return {} if value is None else {option: value}


def dumps_graphs(kind: str | None) -> dict[str, Any]:
    # TorchAir dumps where debug.graph_dump.path says, else in the working directory.
    return {} if kind is None else {"debug_dump_dir": "."}


def dumps_tensors(kind: str | None) -> dict[str, Any]:
    # TorchAir's debug.data_dump runs the graph it was given node by node and saves each
    # tensor: data_dump_stage="original" here.
    return {} if kind is None else {"dump_tensor_data": True, "data_dump_stage": "original"}


SYM_INDEX = to("static_kernel_sym_index", int_range(0))
SYM_VALUES = Field(
    INT_LIST,
    sets=lambda values: {"static_kernel_sym_values": values},
    reads=lambda config: sym_values(config.static_kernel_sym_values),
)


def sym_values(values: tuple[int, ...] | None) -> list[int] | None:
    return None if values is None else list(values)


BOOL_FIELDS = (
    "force_eager",
    "reuse_graph_pool_in_same_fx",
    "clone_input",
    "clone_output",
    "disable_static_kernel_compile_cache",
    "static_kernel_compile",
    "frozen_parameter",
    "remove_noop_ops",
    "remove_cat_ops",
    "inplace_pass",
    "input_inplace_pass",
    "pattern_fusion_pass",
    "dump_tensor_data",
    "super_kernel_optimize",
    "deadlock_check",
    "force_recapture",
)

FLAT: Tree = {
    **{name: to(name, BOOL.flat()) for name in BOOL_FIELDS},
    "use_graph_pool": to("use_graph_pool", PLAIN),
    "capture_limit": to("capture_limit", int_range(1).flat()),
    "data_dump_stage": to("data_dump_stage", choice("original", "optimized").flat()),
    "data_dump_dir": to("data_dump_dir", ANY.flat()),
    "super_kernel_optimize_options": to("super_kernel_optimize_options", DICT),
    "super_kernel_debug_options": to("super_kernel_debug_options", DICT),
    "capture_error_mode": to(
        "capture_error_mode", choice("global", "thread_local", "relaxed").flat()
    ),
    "_vllm_aclnn_static_kernel_sym_index": SYM_INDEX,
    "_vllm_aclnn_static_kernel_sym_range": SYM_VALUES,
}
"""The options npugraph_ex.CompilerConfig spells flat, besides ``mode`` and the custom passes."""

FLAT_NAMES = tuple(FLAT)

ACLGRAPH_REINPLACE: Tree = {
    "disable_reinplace_inplaceable_ops_pass": to("inplace_pass", BOOL, negate=True),
    "disable_reinplace_input_mutated_ops_pass": to("input_inplace_pass", BOOL, negate=True),
}

DEBUG: Tree = {
    "graph_dump": {
        "type": Field(
            choice("txt", "pbtxt", "py"),
            sets=dumps_graphs,
            fills=True,
            note="graphs are dumped as Python here",
            unused=lambda kind: kind in ("txt", "pbtxt"),
        ),
        "path": Field(REAL_PATH, sets=lambda path: set_unless_none("debug_dump_dir", path)),
    },
    "data_dump": {
        "type": Field(choice("npy"), sets=dumps_tensors, fills=True),
        "path": Field(
            REAL_PATH, sets=lambda path: set_unless_none("data_dump_dir", path), fills=True
        ),
        "filter": nothing(PLAIN, note="choose nodes with dump_config.dump_layer patterns"),
    },
    "fx_summary": {
        "type": nothing(choice("csv"), note="no summary is written"),
        "skip_compile": nothing(BOOL, True),
    },
    "run_eagerly": to("force_eager", BOOL),
    "aclgraph": {
        **ACLGRAPH_REINPLACE,
        "disable_mempool_reuse_in_same_fx": to("reuse_graph_pool_in_same_fx", BOOL, negate=True),
        "enable_output_clone": to("clone_output", BOOL),
        "static_capture_size_limit": to("capture_limit", int_range(1)),
        "clone_input": to("clone_input", BOOL),
        "remove_cat_ops": to("remove_cat_ops", BOOL),
    },
    "deadlock_check": to("deadlock_check", BOOL),
}

EXPERIMENTAL: Tree = {
    "cc_parallel_enable": nothing(BOOL, False),
    "keep_inference_input_mutations": nothing(
        BOOL, True, note="input mutations always stay in the graph here"
    ),
    "memory_efficiency": nothing(BOOL, False),
    "frozen_parameter": to("frozen_parameter", BOOL),
    "static_model_ops_lower_limit": nothing(int_range(-1)),
    "jit_compile": nothing(choice("auto"), "auto"),
    "npu_fx_pass": nothing(BOOL, False, note="pattern_fusion_pass fuses for inference"),
    "aot_config_enable_joint_graph": nothing(BOOL, False, note="backward is not compiled"),
    "aot_config_output_loss_index": nothing(ANY, 0),
    "topology_sorting_strategy": nothing(choice("BFS", "DFS", "RDFS", "StableRDFS"), "DFS"),
    "enable_ref_data": nothing(BOOL, False),
    "enable_view_optimize": nothing(BOOL, True),
    "remove_noop_ops": to("remove_noop_ops", BOOL),
    "tiling_schedule_optimize": nothing(BOOL, False),
    "pattern_fusion_pass": to("pattern_fusion_pass", BOOL),
    "aclgraph": {
        "_aclnn_static_shape_kernel": to("static_kernel_compile", BOOL),
        "_aclnn_static_shape_kernel_build_dir": nothing(
            TEXT, note="kernels go to Inductor's cache, TORCHINDUCTOR_CACHE_DIR"
        ),
        "_aclnn_static_shape_kernel_sym_value_range": SYM_VALUES,
        "_aclnn_static_shape_kernel_sym_index": SYM_INDEX,
        "_super_kernel_optimize": to("super_kernel_optimize", BOOL),
        "_super_kernel_optimize_options": to("super_kernel_optimize_options", DICT),
        "_super_kernel_debug_options": to("super_kernel_debug_options", DICT),
    },
}

DUMP: Tree = {
    "enable_dump": to("dump_tensor_data", BOOL),
    "dump_path": to("data_dump_dir", ANY),
    "dump_mode": nothing(
        choice("input", "output", "all"), "all", note="every node's outputs are dumped"
    ),
    "quant_dumpable": nothing(BOOL, False),
    "dump_step": to("data_dump_calls", ANY),
    "dump_layer": Field(
        ANY,
        "",
        sets=lambda layers: {"data_dump_nodes": layers},
        reads=lambda config: " ".join(config.data_dump_nodes),
    ),
    "dump_data": nothing(choice("tensor", "stats"), "tensor", note="whole tensors are dumped"),
    "dump_config_path": nothing(ANY),
    "data_dump_stage": to("data_dump_stage", choice("original", "optimized")),
}

GE: Tree = {
    "enable_single_stream": nothing(BOOL, False),
    "oo_level": nothing(choice("O1", "O3"), "O3"),
    "oo_constant_folding": nothing(BOOL),
    "oo_dead_code_elimination": nothing(BOOL),
    "export_compile_stat": nothing(choice("0", "1", "2"), "2"),
    "aicore_num": nothing(ANY),
    "optimization_switch": nothing(ANY),
}

EXPORT: Tree = {
    "export_mode": nothing(BOOL, False),
    "export_path_dir": nothing(ANY, "./"),
    "export_name": nothing(PLAIN),
    "weight_name": nothing(PLAIN),
    "inputs_name": nothing(PLAIN),
    "experimental": {
        "enable_record_nn_module_stack": nothing(BOOL, False),
        "auto_atc_config_generated": nothing(BOOL, False),
        "enable_lite_export": nothing(BOOL, False),
    },
}

NOT_IN_NPUGRAPHEX_CONFIG = (
    "deadlock_check",
    "capture_error_mode",
    "disable_static_kernel_compile_cache",
    "force_recapture",
)
NPUGRAPHEX_NOTE = "TorchAir fills it from torch.compile options; set those instead"
NPUGRAPHEX_NAMES = (
    *(name for name in FLAT_NAMES if name not in NOT_IN_NPUGRAPHEX_CONFIG),
    "post_grad_custom_pre_pass",
    "post_grad_custom_post_pass",
)
"""TorchAir's ``config.npugraphex_config`` (a plain class it fills from torch.compile options)."""

TREE: Tree = {
    "mode": to("mode", choice("max-autotune", "reduce-overhead", "npugraph_ex")),
    "post_grad_custom_pre_pass": custom_pass("post_grad_custom_pre_pass"),
    "post_grad_custom_post_pass": custom_pass("post_grad_custom_post_pass"),
    **FLAT,
    "debug": DEBUG,
    "experimental_config": EXPERIMENTAL,
    "dump_config": DUMP,
    "aclgraph_config": {
        "use_custom_pool": to("use_graph_pool", PLAIN),
        **ACLGRAPH_REINPLACE,  # TorchAir's earlier spelling of the debug.aclgraph fields
    },
    "ge_config": GE,
    "inference_config": {"dynamic_gears_merge_policy": nothing(choice("zip", "product"), "zip")},
    "aoe_config": {
        "aoe_mode": nothing(choice("2")),
        "work_path": nothing(ANY, "./"),
        "aoe_config_file": nothing(ANY),
    },
    "fusion_config": {"fusion_switch_file": nothing(ANY)},
    "export": EXPORT,
    "npugraphex_config": {
        name: nothing(PLAIN, FLAT[name].default if name in FLAT else None, note=NPUGRAPHEX_NOTE)
        for name in NPUGRAPHEX_NAMES
    },
}
"""TorchAir's CompilerConfig tree, both spellings."""
