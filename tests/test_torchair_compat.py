"""TorchAir spellings: every field of TorchAir's CompilerConfig tree is accepted with TorchAir's
checks and reads back through ``.value`` as in TorchAir; each maps onto the flat options or is
named in one warning; get_npu_backend hands the mapped options to the backend and custom passes
the config."""

from __future__ import annotations

import copy
import logging
import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from npugraph_ex.config import Config
from npugraph_ex.errors import ConfigError, ConfigTypeError
from npugraph_ex.torchair_compat import (
    CompilerConfig,
    ConfiguredBackend,
    OptionValue,
    TorchAirPass,
    get_npu_backend,
)


def custom_pass(gm: Any, example_inputs: Any, config: Any) -> None:
    """A custom pass that does nothing."""


def set_path(config: CompilerConfig, spelling: str, value: Any) -> None:
    *groups, leaf = spelling.split(".")
    target: Any = config
    for name in groups:
        target = getattr(target, name)
    setattr(target, leaf, value)


def get_path(config: CompilerConfig, spelling: str) -> Any:
    target: Any = config
    for name in spelling.split("."):
        target = getattr(target, name)
    return target


def read(config: CompilerConfig, spelling: str) -> Any:
    """What TorchAir code reads: ``.value`` of an option object, a plain attribute as it is."""
    found = get_path(config, spelling)
    return found.value if isinstance(found, OptionValue) else found


NPUGRAPHEX_CONFIG_NAMES = (
    "force_eager", "use_graph_pool", "reuse_graph_pool_in_same_fx", "capture_limit",
    "clone_input", "clone_output", "static_kernel_compile", "super_kernel_optimize",
    "super_kernel_optimize_options", "super_kernel_debug_options", "frozen_parameter",
    "remove_noop_ops", "remove_cat_ops", "inplace_pass", "input_inplace_pass",
    "pattern_fusion_pass", "post_grad_custom_pre_pass", "post_grad_custom_post_pass",
    "dump_tensor_data", "data_dump_stage", "data_dump_dir", "_vllm_aclnn_static_kernel_sym_index",
    "_vllm_aclnn_static_kernel_sym_range",
)  # fmt: skip
"""TorchAir's ``_NpuGraphExConfig`` (``config.npugraphex_config``)."""

FLAT_FIELDS: dict[str, Any] = {
    "force_eager": True,
    "use_graph_pool": (1, 2),
    "reuse_graph_pool_in_same_fx": False,
    "capture_limit": 8,
    "clone_input": False,
    "clone_output": True,
    "disable_static_kernel_compile_cache": True,
    "static_kernel_compile": True,
    "frozen_parameter": True,
    "remove_noop_ops": False,
    "remove_cat_ops": False,
    "inplace_pass": False,
    "input_inplace_pass": False,
    "pattern_fusion_pass": False,
    "post_grad_custom_pre_pass": custom_pass,
    "post_grad_custom_post_pass": custom_pass,
    "dump_tensor_data": True,
    "data_dump_stage": "original",
    "data_dump_dir": ".",
    "_vllm_aclnn_static_kernel_sym_index": 1,
    "_vllm_aclnn_static_kernel_sym_range": [1, 8],
    "super_kernel_optimize": True,
    "super_kernel_optimize_options": {"a": 1},
    "super_kernel_debug_options": {"b": 1},
    "deadlock_check": True,
    "capture_error_mode": "relaxed",
    "mode": "max-autotune",
    "force_recapture": True,
}
"""npugraph_ex.CompilerConfig (TorchAir's standalone package), a valid non-default value each."""

TORCHAIR_FIELDS: dict[str, Any] = {
    **FLAT_FIELDS,
    "debug.graph_dump.type": "py",
    "debug.graph_dump.path": "graphs",
    "debug.data_dump.type": "npy",
    "debug.data_dump.filter": lambda node: node,
    "debug.data_dump.path": "TMP",
    "debug.fx_summary.type": "csv",
    "debug.fx_summary.skip_compile": False,
    "debug.run_eagerly": True,
    "debug.aclgraph.disable_reinplace_inplaceable_ops_pass": True,
    "debug.aclgraph.disable_reinplace_input_mutated_ops_pass": True,
    "debug.aclgraph.disable_mempool_reuse_in_same_fx": True,
    "debug.aclgraph.enable_output_clone": True,
    "debug.aclgraph.static_capture_size_limit": 16,
    "debug.aclgraph.clone_input": False,
    "debug.aclgraph.remove_cat_ops": False,
    "debug.deadlock_check": True,
    "experimental_config.cc_parallel_enable": True,
    "experimental_config.keep_inference_input_mutations": False,
    "experimental_config.memory_efficiency": True,
    "experimental_config.frozen_parameter": True,
    "experimental_config.static_model_ops_lower_limit": 4,
    "experimental_config.jit_compile": "auto",
    "experimental_config.npu_fx_pass": True,
    "experimental_config.aot_config_enable_joint_graph": True,
    "experimental_config.aot_config_output_loss_index": 1,
    "experimental_config.topology_sorting_strategy": "StableRDFS",
    "experimental_config.enable_ref_data": True,
    "experimental_config.enable_view_optimize": False,
    "experimental_config.remove_noop_ops": False,
    "experimental_config.tiling_schedule_optimize": True,
    "experimental_config.pattern_fusion_pass": False,
    "experimental_config.aclgraph._aclnn_static_shape_kernel": True,
    "experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir": "/tmp/kernels",
    "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range": [1, 64],
    "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index": 0,
    "experimental_config.aclgraph._super_kernel_optimize": True,
    "experimental_config.aclgraph._super_kernel_optimize_options": {"x": 1},
    "experimental_config.aclgraph._super_kernel_debug_options": {"y": 1},
    "dump_config.enable_dump": True,
    "dump_config.dump_path": ".",
    "dump_config.dump_mode": "input",
    "dump_config.quant_dumpable": True,
    "dump_config.dump_step": "0|2-4",
    "dump_config.dump_layer": "Mul_1 Add1",
    "dump_config.dump_data": "stats",
    "dump_config.dump_config_path": "acl_dump.json",
    "dump_config.data_dump_stage": "original",
    "aclgraph_config.use_custom_pool": (1, 2),
    # TorchAir's earlier spelling of the two debug.aclgraph reinplace fields.
    "aclgraph_config.disable_reinplace_inplaceable_ops_pass": True,
    "aclgraph_config.disable_reinplace_input_mutated_ops_pass": True,
    "ge_config.enable_single_stream": True,
    "ge_config.oo_level": "O1",
    "ge_config.oo_constant_folding": False,
    "ge_config.oo_dead_code_elimination": True,
    "ge_config.export_compile_stat": "1",
    "ge_config.aicore_num": "2|2",
    "ge_config.optimization_switch": "pass:off",
    "inference_config.dynamic_gears_merge_policy": "product",
    "aoe_config.aoe_mode": "2",
    "aoe_config.work_path": ".",
    "aoe_config.aoe_config_file": "aoe.cfg",
    "fusion_config.fusion_switch_file": "fusion_switch.cfg",
    "export.export_mode": True,
    "export.export_path_dir": ".",
    "export.export_name": "model",
    "export.weight_name": "weights",
    "export.inputs_name": "inputs",
    "export.experimental.enable_record_nn_module_stack": True,
    "export.experimental.auto_atc_config_generated": True,
    "export.experimental.enable_lite_export": True,
    **{f"npugraphex_config.{name}": FLAT_FIELDS[name] for name in NPUGRAPHEX_CONFIG_NAMES},
}
"""Every field of torchair.CompilerConfig and npugraph_ex.CompilerConfig, as TorchAir's
configs/*.py define them, with a value TorchAir accepts ("TMP": a fresh folder)."""

UNMAPPED = {
    "debug.data_dump.filter",
    "debug.fx_summary.type",
    "debug.fx_summary.skip_compile",
    "experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir",
    *(name for name in TORCHAIR_FIELDS if name.startswith("npugraphex_config.")),
    *(
        f"experimental_config.{name}"
        for name in (
            "cc_parallel_enable", "keep_inference_input_mutations", "memory_efficiency",
            "static_model_ops_lower_limit", "npu_fx_pass", "aot_config_enable_joint_graph",
            "aot_config_output_loss_index", "topology_sorting_strategy", "enable_ref_data",
            "enable_view_optimize", "tiling_schedule_optimize",
        )
    ),
    *(
        f"dump_config.{name}"
        for name in ("dump_mode", "quant_dumpable", "dump_data", "dump_config_path")
    ),
    *(name for name in TORCHAIR_FIELDS if name.split(".")[0] in {
        "ge_config", "inference_config", "aoe_config", "fusion_config", "export"
    }),
}  # fmt: skip
"""Fields that mean nothing off Ascend's graph engine: set, they are named in the warning."""

ONLY_A_DEFAULT = {"experimental_config.jit_compile"}
"""Fields whose one choice is their default: nothing to map, nothing to warn about."""


def test_every_torchair_field_is_in_the_tree() -> None:
    spellings = {spelling for spelling, _, _ in CompilerConfig().fields()}
    assert spellings == set(TORCHAIR_FIELDS)


@pytest.mark.parametrize(("spelling", "value"), TORCHAIR_FIELDS.items())
def test_every_torchair_field_is_accepted(
    spelling: str, value: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    value = str(tmp_path / "made") if value == "TMP" else value
    config = CompilerConfig()
    set_path(config, spelling, value)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        backend = get_npu_backend(compiler_config=config)
    unused = spelling in UNMAPPED
    assert bool(config.unused_fields()) == unused
    assert bool(backend.options) == (not unused and spelling not in ONLY_A_DEFAULT)
    if unused:
        assert f"are ignored: {spelling}={value!r}" in caplog.text


# TorchAir spelling, value set, flat options it must produce.
MAPPINGS = [
    ("mode", "max-autotune", {"mode": "max-autotune"}),
    ("debug.run_eagerly", True, {"force_eager": True}),
    ("debug.aclgraph.clone_input", False, {"clone_input": False}),
    ("debug.aclgraph.disable_reinplace_inplaceable_ops_pass", True, {"inplace_pass": False}),
    (
        "debug.aclgraph.disable_reinplace_input_mutated_ops_pass",
        True,
        {"input_inplace_pass": False},
    ),
    (
        "debug.aclgraph.disable_mempool_reuse_in_same_fx",
        True,
        {"reuse_graph_pool_in_same_fx": False},
    ),
    ("debug.aclgraph.static_capture_size_limit", 8, {"capture_limit": 8}),
    ("debug.aclgraph.enable_output_clone", True, {"clone_output": True}),
    ("debug.graph_dump.path", "graphs", {"debug_dump_dir": os.path.realpath("graphs")}),
    ("debug.graph_dump.type", "py", {"debug_dump_dir": "."}),
    ("debug.data_dump.type", "npy", {"dump_tensor_data": True, "data_dump_stage": "original"}),
    ("experimental_config.frozen_parameter", True, {"frozen_parameter": True}),
    ("experimental_config.remove_noop_ops", False, {"remove_noop_ops": False}),
    ("experimental_config.pattern_fusion_pass", False, {"pattern_fusion_pass": False}),
    (
        "experimental_config.aclgraph._aclnn_static_shape_kernel",
        True,
        {"static_kernel_compile": True},
    ),
    (
        "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index",
        2,
        {"static_kernel_sym_index": 2},
    ),
    (
        "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range",
        [1, 8],
        {"static_kernel_sym_values": [1, 8]},
    ),
    ("aclgraph_config.use_custom_pool", (1, 2), {"use_graph_pool": (1, 2)}),
    ("aclgraph_config.disable_reinplace_inplaceable_ops_pass", True, {"inplace_pass": False}),
    (
        "aclgraph_config.disable_reinplace_input_mutated_ops_pass",
        True,
        {"input_inplace_pass": False},
    ),
    ("dump_config.enable_dump", True, {"dump_tensor_data": True}),
    ("dump_config.dump_path", "dumps", {"data_dump_dir": "dumps"}),
    ("dump_config.dump_step", "0|3-5", {"data_dump_calls": "0|3-5"}),
    ("dump_config.dump_layer", "mm_1 add_1", {"data_dump_nodes": "mm_1 add_1"}),
    ("dump_config.data_dump_stage", "original", {"data_dump_stage": "original"}),
    ("post_grad_custom_pre_pass", custom_pass, {"post_grad_custom_pre_pass": custom_pass}),
    ("post_grad_custom_post_pass", custom_pass, {"post_grad_custom_post_pass": custom_pass}),
    ("debug.aclgraph.remove_cat_ops", False, {"remove_cat_ops": False}),
    ("debug.deadlock_check", True, {"deadlock_check": True}),
    ("experimental_config.aclgraph._super_kernel_optimize", True, {"super_kernel_optimize": True}),
    (
        "experimental_config.aclgraph._super_kernel_optimize_options",
        {"a": 1},
        {"super_kernel_optimize_options": {"a": 1}},
    ),
    (
        "experimental_config.aclgraph._super_kernel_debug_options",
        {"b": 2},
        {"super_kernel_debug_options": {"b": 2}},
    ),
    # TorchAir's npugraph_ex.CompilerConfig spells the options flat.
    ("clone_output", True, {"clone_output": True}),
    ("capture_limit", 8, {"capture_limit": 8}),
    ("force_recapture", True, {"force_recapture": True}),
    ("capture_error_mode", "relaxed", {"capture_error_mode": "relaxed"}),
    ("remove_cat_ops", False, {"remove_cat_ops": False}),
    ("data_dump_stage", "original", {"data_dump_stage": "original"}),
    ("disable_static_kernel_compile_cache", True, {"disable_static_kernel_compile_cache": True}),
    ("_vllm_aclnn_static_kernel_sym_index", 3, {"static_kernel_sym_index": 3}),
    ("_vllm_aclnn_static_kernel_sym_range", [4], {"static_kernel_sym_values": [4]}),
]

NEGATED = [
    ("debug.aclgraph.disable_reinplace_inplaceable_ops_pass", "inplace_pass"),
    ("debug.aclgraph.disable_reinplace_input_mutated_ops_pass", "input_inplace_pass"),
    ("debug.aclgraph.disable_mempool_reuse_in_same_fx", "reuse_graph_pool_in_same_fx"),
    ("aclgraph_config.disable_reinplace_inplaceable_ops_pass", "inplace_pass"),
    ("aclgraph_config.disable_reinplace_input_mutated_ops_pass", "input_inplace_pass"),
]

ACLGRAPH_NAMES = ", ".join(
    sorted(name.split(".")[-1] for name in TORCHAIR_FIELDS if name.startswith("debug.aclgraph."))
)
TOP_NAMES = ", ".join(sorted({name.split(".")[0] for name in TORCHAIR_FIELDS}))


def test_unset_config_gives_defaults() -> None:
    config = CompilerConfig()
    assert config.to_options() == {}
    assert config.to_config() == Config()
    assert config.unused_fields() == []


@pytest.mark.parametrize(("spelling", "value", "options"), MAPPINGS)
def test_spelling_maps_to_option(spelling: str, value: Any, options: dict[str, Any]) -> None:
    config = CompilerConfig()
    set_path(config, spelling, value)
    assert config.to_options() == options
    assert config.to_config() == Config.from_options(options)
    assert config.unused_fields() == []


@pytest.mark.parametrize(("spelling", "option"), NEGATED)
def test_negated_false_enables_option(spelling: str, option: str) -> None:
    config = CompilerConfig()
    set_path(config, spelling, False)
    assert config.to_options() == {option: True}


@pytest.mark.parametrize(("spelling", "option"), NEGATED)
def test_bool_fields_check_torchair_choices_where_written(spelling: str, option: str) -> None:
    config = CompilerConfig()
    with pytest.raises(ConfigError) as info:
        set_path(config, spelling, "yes")
    assert str(info.value) == (f"CompilerConfig().{spelling} must be one of True, False, got 'yes'")
    set_path(config, spelling, 1)  # TorchAir compares with ==, so 1 is True
    assert config.to_options() == {option: False}


@pytest.mark.parametrize(
    ("spelling", "value", "reads"),
    [
        ("debug.run_eagerly", True, "1"),
        ("debug.run_eagerly", False, "0"),
        ("debug.aclgraph.static_capture_size_limit", 8, "8"),
        ("dump_config.data_dump_stage", "original", "original"),
        ("dump_config.enable_dump", True, "1"),
        ("ge_config.oo_level", "O1", "O1"),
        ("experimental_config.topology_sorting_strategy", "BFS", "BFS"),
        ("experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range", [1], [1]),
        ("experimental_config.aclgraph._super_kernel_optimize_options", {"a": 1}, {"a": 1}),
        ("post_grad_custom_pre_pass", custom_pass, custom_pass),
        ("mode", "npugraph_ex", "npugraph_ex"),
        # npugraph_ex.CompilerConfig keeps bools and reads the rest as str.
        ("force_eager", True, True),
        ("capture_limit", 8, "8"),
        ("_vllm_aclnn_static_kernel_sym_index", 2, "2"),
        # Plain attributes in TorchAir: read as assigned (a path as its real path).
        ("aclgraph_config.use_custom_pool", (1, 2), (1, 2)),
        ("use_graph_pool", (1, 2), (1, 2)),
        ("debug.graph_dump.path", "graphs", os.path.realpath("graphs")),
    ],
)
def test_values_read_as_in_torchair(spelling: str, value: Any, reads: Any) -> None:
    config = CompilerConfig()
    set_path(config, spelling, value)
    assert read(config, spelling) == reads


@pytest.mark.parametrize(
    ("spelling", "default"),
    [
        ("mode", "npugraph_ex"),
        ("debug.run_eagerly", "0"),
        ("debug.aclgraph.clone_input", "1"),
        ("debug.aclgraph.static_capture_size_limit", "64"),
        ("debug.aclgraph.disable_mempool_reuse_in_same_fx", "0"),
        ("aclgraph_config.disable_reinplace_inplaceable_ops_pass", "0"),
        ("aclgraph_config.use_custom_pool", None),
        ("debug.graph_dump.type", None),
        ("debug.graph_dump.path", None),
        ("dump_config.dump_path", "./"),
        ("dump_config.dump_mode", "all"),
        ("experimental_config.keep_inference_input_mutations", "1"),
        ("experimental_config.topology_sorting_strategy", "DFS"),
        ("ge_config.oo_level", "O3"),
        ("ge_config.export_compile_stat", "2"),
        ("inference_config.dynamic_gears_merge_policy", "zip"),
        ("clone_input", True),
        ("capture_limit", "64"),
        ("_vllm_aclnn_static_kernel_sym_range", None),
    ],
)
def test_unset_field_reads_its_default(spelling: str, default: Any) -> None:
    assert read(CompilerConfig(), spelling) == default


def test_option_objects_behave_as_torchair_s() -> None:
    config = CompilerConfig()
    option = config.experimental_config.topology_sorting_strategy
    assert (option.default, option.optional) == ("DFS", ["BFS", "DFS", "RDFS", "StableRDFS"])
    option.value = "RDFS"  # assigning .value checks and sets, as in TorchAir
    assert config.experimental_config.topology_sorting_strategy.value == "RDFS"
    with pytest.raises(ConfigError, match="must be one of 'BFS', 'DFS', 'RDFS', 'StableRDFS'"):
        option.value = "LIFO"
    assert bool(config.debug.run_eagerly) is False
    config.debug.run_eagerly = True
    assert bool(config.debug.run_eagerly) is True
    assert config.debug.aclgraph.static_capture_size_limit.optional is None


@pytest.mark.parametrize(
    ("spelling", "value", "error", "message"),
    [
        ("debug.aclgraph.static_capture_size_limit", 0, ConfigError, "an int in [1, "),
        ("debug.aclgraph.static_capture_size_limit", "8", ConfigTypeError, "an int in [1, "),
        ("ge_config.oo_level", "O2", ConfigError, "one of 'O1', 'O3'"),
        ("aoe_config.aoe_mode", 2, ConfigError, "one of '2'"),
        ("dump_config.dump_mode", "both", ConfigError, "one of 'input', 'output', 'all'"),
        ("mode", "fast", ConfigError, "one of 'max-autotune', 'reduce-overhead', 'npugraph_ex'"),
        (
            "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range",
            [1, "2"],
            ConfigTypeError,
            "a list of ints or None",
        ),
        ("_vllm_aclnn_static_kernel_sym_index", -1, ConfigError, "an int in [0, "),
        ("super_kernel_optimize_options", [1], ConfigTypeError, "a dict or None"),
        ("post_grad_custom_pre_pass", "fn", ConfigTypeError, "a callable or None"),
        ("experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir", 3, TypeError, "str"),
    ],
)
def test_torchair_checks_run_where_the_value_is_written(
    spelling: str, value: Any, error: type[Exception], message: str
) -> None:
    config = CompilerConfig()
    with pytest.raises(error) as info:
        set_path(config, spelling, value)
    assert str(info.value).startswith(f"CompilerConfig().{spelling} must be ")
    assert message in str(info.value)
    assert config.to_options() == {}


def test_both_reinplace_spellings_agree() -> None:
    config = CompilerConfig()
    config.debug.aclgraph.disable_reinplace_inplaceable_ops_pass = True
    config.aclgraph_config.disable_reinplace_inplaceable_ops_pass = True
    assert config.to_options() == {"inplace_pass": False}


def test_both_reinplace_spellings_conflict() -> None:
    config = CompilerConfig()
    config.debug.aclgraph.disable_reinplace_input_mutated_ops_pass = True
    config.aclgraph_config.disable_reinplace_input_mutated_ops_pass = False
    with pytest.raises(ConfigError, match="set only one of them") as info:
        config.to_options()
    message = str(info.value)
    assert "CompilerConfig().debug.aclgraph.disable_reinplace_input_mutated_ops_pass" in message
    assert "CompilerConfig().aclgraph_config.disable_reinplace_input_mutated_ops_pass" in message


def test_graph_dump_path_wins_over_the_default_folder() -> None:
    config = CompilerConfig()
    config.debug.graph_dump.type = "py"
    config.debug.graph_dump.path = "graphs"
    assert config.to_options() == {"debug_dump_dir": os.path.realpath("graphs")}


@pytest.mark.parametrize("kind", ["txt", "pbtxt"])
def test_graph_engine_dump_types_dump_python_and_say_so(kind: str) -> None:
    config = CompilerConfig()
    config.debug.graph_dump.type = kind
    assert config.to_options() == {"debug_dump_dir": "."}
    assert config.unused_fields() == [
        f"debug.graph_dump.type={kind!r} (graphs are dumped as Python here)"
    ]


def test_data_dump_fills_what_dump_config_leaves_unset(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.debug.data_dump.type = "npy"
    config.debug.data_dump.path = tmp_path / "eager"
    config.dump_config.data_dump_stage = "optimized"
    assert config.to_options() == {
        "data_dump_stage": "optimized",
        "dump_tensor_data": True,
        "data_dump_dir": str(tmp_path / "eager"),
    }
    get_npu_backend(compiler_config=config)
    assert (tmp_path / "eager").is_dir()  # TorchAir makes it when it dumps


def test_unused_fields_name_value_and_why() -> None:
    config = CompilerConfig()
    config.experimental_config.keep_inference_input_mutations = False
    config.ge_config.oo_level = "O3"  # TorchAir's default: nothing to say
    config.ge_config.oo_level = "O1"
    assert config.unused_fields() == [
        "experimental_config.keep_inference_input_mutations=False (input mutations always stay "
        "in the graph here)",
        "ge_config.oo_level='O1'",
    ]


@pytest.mark.parametrize("access", ["get", "set"])
def test_unknown_nested_name_suggests_closest(access: str) -> None:
    aclgraph = CompilerConfig().debug.aclgraph
    with pytest.raises(AttributeError) as info:
        if access == "get":
            _ = aclgraph.clone_inptu
        else:
            aclgraph.clone_inptu = False
    assert str(info.value) == (
        "CompilerConfig().debug.aclgraph has no option 'clone_inptu'; did you mean "
        f"'clone_input'? Valid names here: {ACLGRAPH_NAMES}"
    )


@pytest.mark.parametrize("access", ["get", "set"])
def test_unknown_top_level_name(access: str) -> None:
    config = CompilerConfig()
    with pytest.raises(AttributeError) as info:
        if access == "get":
            _ = config.debgu
        else:
            config.debgu = True
    assert str(info.value) == (
        "CompilerConfig() has no option 'debgu'; did you mean 'debug'? "
        f"Valid names here: {TOP_NAMES}"
    )


def test_unknown_name_without_close_match() -> None:
    config = CompilerConfig()
    with pytest.raises(AttributeError) as info:
        config.dump_config.zzz = 1
    names = sorted(n.split(".")[1] for n in TORCHAIR_FIELDS if n.startswith("dump_config."))
    assert str(info.value) == (
        f"CompilerConfig().dump_config has no option 'zzz'. Valid names here: {', '.join(names)}"
    )
    assert not hasattr(config.experimental_config, "frozen_parameters")


def test_group_cannot_be_assigned() -> None:
    config = CompilerConfig()
    with pytest.raises(AttributeError, match="is a group of options and cannot be assigned"):
        config.debug = {"run_eagerly": True}
    assert config.to_options() == {}


def test_instances_are_independent() -> None:
    first, second = CompilerConfig(), CompilerConfig()
    first.debug.run_eagerly = True
    assert second.debug.run_eagerly.value == "0"
    clone = copy.deepcopy(first)
    clone.debug.aclgraph.static_capture_size_limit = 2
    same = first.copy()
    same.experimental_config.frozen_parameter = True
    assert first.to_options() == {"force_eager": True}
    assert clone.to_options() == {"force_eager": True, "capture_limit": 2}
    assert same.to_options() == {"force_eager": True, "frozen_parameter": True}


def test_a_config_pickles() -> None:
    config = CompilerConfig()
    config.ge_config.oo_level = "O1"
    config.post_grad_custom_pre_pass = custom_pass
    loaded = pickle.loads(pickle.dumps(config))
    assert loaded == config
    assert loaded.to_options() == {"post_grad_custom_pre_pass": custom_pass}
    assert loaded.unused_fields() == ["ge_config.oo_level='O1'"]


def test_configs_compare_by_their_values() -> None:
    first, second = CompilerConfig(), CompilerConfig()
    assert first == second
    first.ge_config.oo_level = "O1"
    assert first != second
    second.ge_config.oo_level = "O1"
    assert first == second


def test_as_dict_is_torchair_shaped() -> None:
    config = CompilerConfig()
    config.debug.run_eagerly = True
    config.post_grad_custom_pre_pass = custom_pass
    local, global_options = config.as_dict()
    assert global_options == {}
    assert (local["run_eagerly"], local["static_capture_size_limit"]) == ("1", "64")
    assert (local["oo_level"], local["mode"]) == ("O3", "npugraph_ex")
    assert "post_grad_custom_pre_pass" not in local  # TorchAir leaves the passes out
    assert "force_eager" not in local  # flat names only where set
    config.force_eager = True
    assert config.as_dict()[0]["force_eager"] is True
    assert config.debug.as_dict()[0]["run_eagerly"] == "1"


def test_to_config_surfaces_validation_errors() -> None:
    config = CompilerConfig()
    config.dump_config.dump_step = "3-"
    assert config.to_options() == {"data_dump_calls": "3-"}
    with pytest.raises(ConfigError) as info:
        config.to_config()
    assert str(info.value).startswith("data_dump_calls must be calls such as '0|2-4'")
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == ["(set as CompilerConfig().dump_config.dump_step)"]


def test_reduce_overhead_mode_is_kept_quietly() -> None:
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    assert config.to_options() == {"mode": "reduce-overhead"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config.to_config().mode == "npugraph_ex"


def test_repr_shows_what_was_set() -> None:
    config = CompilerConfig()
    config.debug.run_eagerly = True
    assert repr(config) == "CompilerConfig(debug.run_eagerly=True)"


def test_get_npu_backend_checks_custom_decompositions() -> None:
    with pytest.raises(ConfigTypeError, match="custom_decompositions must be a dict of ATen ops"):
        get_npu_backend(custom_decompositions=["aten.gelu"])  # type: ignore[arg-type]
    with pytest.raises(ConfigTypeError, match="custom_decompositions must be a dict of ATen ops"):
        get_npu_backend(custom_decompositions={"aten.gelu": lambda x: x})
    assert get_npu_backend(custom_decompositions={}).options == {}


def test_get_npu_backend_validates_before_compiling() -> None:
    config = CompilerConfig()
    config.dump_config.dump_step = "x"
    with pytest.raises(ConfigError, match="data_dump_calls must be calls such as"):
        get_npu_backend(compiler_config=config)
    with pytest.raises(ConfigTypeError, match="compiler_config must be a CompilerConfig or None"):
        get_npu_backend(compiler_config={"mode": "npugraph_ex"})  # type: ignore[arg-type]


@pytest.mark.parametrize(("spelling", "value", "options"), MAPPINGS[:8])
def test_get_npu_backend_passes_mapped_options(
    spelling: str, value: Any, options: dict[str, Any]
) -> None:
    config = CompilerConfig()
    set_path(config, spelling, value)
    compiled = get_npu_backend(compiler_config=config, custom_decompositions={})
    assert isinstance(compiled, ConfiguredBackend)
    assert compiled.options == options
    assert compiled.compiler_config == config


def test_get_npu_backend_without_config() -> None:
    assert get_npu_backend().options == {}


def returns_copies(backend: Any, **compile_kwargs: Any) -> bool:
    """Whether a call returns private copies of its outputs (``clone_output``), or the graph's
    own memory (the default), which the graph's pool and tensors reference too."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, **compile_kwargs)
    with torch.no_grad():
        compiled(torch.ones(4))  # captured
        output = compiled(torch.ones(4))  # replayed
    assert torch.equal(output, torch.full((4,), 2.0))
    # Held by ``output`` and by the handle the count is read through, and nothing else.
    return torch._C._storage_Use_Count(output.untyped_storage()._cdata) == 2


def output_clone_config() -> CompilerConfig:
    config = CompilerConfig()
    config.debug.aclgraph.enable_output_clone = True
    return config


def test_options_given_to_torch_compile_merge_with_the_config() -> None:
    backend = get_npu_backend(compiler_config=output_clone_config())
    assert returns_copies(backend, options={"capture_limit": 8})
    assert not returns_copies(get_npu_backend(), options={"capture_limit": 8})


def test_an_option_set_both_ways_takes_the_options_value_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = get_npu_backend(compiler_config=output_clone_config())
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        assert not returns_copies(backend, options={"clone_output": False})
        assert not returns_copies(backend, options={"clone_output": False})
    assert (
        caplog.text.count(
            "torch.compile(options={'clone_output': False}) overrides the CompilerConfig's "
            "clone_output=True; set it in one place only"
        )
        == 1
    )


class ConfigReader:
    """A custom pass that keeps what it read from the config it was given."""

    def __init__(self) -> None:
        self.reads: list[dict[str, Any]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        self.reads.append(
            {
                "type": type(config).__name__,
                "mode": config.mode.value,
                "clone_input": config.debug.aclgraph.clone_input.value,
                "limit": config.debug.aclgraph.static_capture_size_limit.value,
                "flat_limit": config.capture_limit.value,
                "frozen": config.experimental_config.frozen_parameter.value,
                "oo_level": config.ge_config.oo_level.value,
                "pass": config.post_grad_custom_post_pass.value,
            }
        )


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_a_custom_pass_reads_the_config_as_torchair_passes_it() -> None:
    reader = ConfigReader()
    config = CompilerConfig()
    config.mode = "npugraph_ex"
    config.debug.aclgraph.clone_input = False
    config.ge_config.oo_level = "O1"
    config.post_grad_custom_post_pass = reader
    backend = get_npu_backend(compiler_config=config)
    compiled = torch.compile(double, backend=backend, options={"capture_limit": 5})
    with torch.no_grad():
        assert torch.equal(compiled(torch.ones(3)), double(torch.ones(3)))
    # Once per lowering: on CPU the kernel tier lowers the graph for Inductor too.
    assert reader.reads and reader.reads == [reader.reads[0]] * len(reader.reads)
    assert reader.reads[:1] == [
        {
            "type": "CompilerConfig",
            "mode": "npugraph_ex",
            "clone_input": "0",
            "limit": "5",  # torch.compile(options=...) is what is in effect
            "flat_limit": "5",
            "frozen": "0",
            "oo_level": "O1",
            "pass": reader,
        }
    ]


def test_the_plain_backend_gives_custom_passes_the_config() -> None:
    seen: list[Any] = []
    options = {"post_grad_custom_pre_pass": lambda gm, inputs, config: seen.append(config)}
    compiled = torch.compile(double, backend="npugraph_ex", options=options)
    with torch.no_grad():
        compiled(torch.ones(3))
    assert [type(config) for config in seen] == [Config]


def test_a_wrapped_pass_hashes_as_the_user_s_function() -> None:
    wrapped = TorchAirPass(custom_pass, CompilerConfig())
    assert wrapped.__wrapped__ is custom_pass
    assert (
        Config(post_grad_custom_pre_pass=wrapped).compute_hash()
        == Config(post_grad_custom_pre_pass=custom_pass).compute_hash()
    )


SYM_SPELLINGS = [
    (
        "_vllm_aclnn_static_kernel_sym_index",
        "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index",
    ),
    (
        "_vllm_aclnn_static_kernel_sym_range",
        "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range",
    ),
]


def outcome(build: Any) -> Config | type[Exception]:
    """The Config ``build()`` makes, or the kind of error it raises."""
    try:
        return build()
    except (ConfigError, ValueError, TypeError) as error:
        return TypeError if isinstance(error, TypeError) else ValueError


@pytest.mark.parametrize(("flat", "nested"), SYM_SPELLINGS)
@pytest.mark.parametrize("value", [0, 3, -1, True, [2, 4], (8,), [], None, [1, "2"], "1"])
def test_static_kernel_sym_options_mean_the_same_in_every_spelling(
    flat: str, nested: str, value: Any
) -> None:
    """torch.compile(options=...) with TorchAir's flat name, the same name on the config, and
    the nested field: the same Config, or the same kind of error."""

    def through_config(spelling: str) -> Config:
        config = CompilerConfig()
        set_path(config, spelling, value)
        get_npu_backend(compiler_config=config)  # what a script calls; validates
        return config.to_config()

    outcomes = [
        outcome(lambda: Config.from_options({flat: value})),
        outcome(lambda: through_config(flat)),
        outcome(lambda: through_config(nested)),
    ]
    assert outcomes[0] == outcomes[1] == outcomes[2]


@torch.no_grad()
def test_break_graph_op_list_is_said_not_applied_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("BREAK_GRAPH_OP_LIST", "SLICE,NN.CONV3D")
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for fn in (lambda x: x[1:] + 1, lambda x: x[:2] * 2):
            compiled = torch.compile(fn, backend="npugraph_ex")
            x = torch.randn(4)
            assert torch.equal(compiled(x), fn(x))
    said = [r.getMessage() for r in caplog.records if "BREAK_GRAPH_OP_LIST" in r.getMessage()]
    assert said == [
        "npugraph_ex: BREAK_GRAPH_OP_LIST='SLICE,NN.CONV3D' is TorchAir's patch of Dynamo and is "
        "not applied here: the listed ops stay in the graph. Break the graph where you need it "
        "with torch._dynamo.graph_break(), or keep a module out of it with "
        "torch.compiler.disable."
    ]
