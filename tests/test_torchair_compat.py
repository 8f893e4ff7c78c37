"""TorchAir spellings map onto the flat options, unknown names fail where they are written, and
get_npu_backend hands the mapped options to the backend."""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

import pytest

from npugraph_ex.config import Config
from npugraph_ex.errors import ConfigError, ConfigTypeError
from npugraph_ex.torchair_compat import CompilerConfig, ConfiguredBackend, get_npu_backend


def custom_pass(graph: Any) -> None:
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


# TorchAir spelling, value set, flat options it must produce.
MAPPINGS = [
    ("mode", "max-autotune", {"mode": "max-autotune"}),
    ("debug.run_eagerly", True, {"force_eager": True}),
    ("debug.aclgraph.clone_input", False, {"clone_input": False}),
    (
        "debug.aclgraph.disable_reinplace_inplaceable_ops_pass",
        True,
        {"inplace_pass": False},
    ),
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
    ("debug.graph_dump.path", "graphs", {"debug_dump_dir": "graphs"}),
    ("experimental_config.frozen_parameter", True, {"frozen_parameter": True}),
    ("experimental_config.remove_noop_ops", False, {"remove_noop_ops": False}),
    ("experimental_config.pattern_fusion_pass", False, {"pattern_fusion_pass": False}),
    (
        "experimental_config.aclgraph._aclnn_static_shape_kernel",
        True,
        {"static_kernel_compile": True},
    ),
    ("aclgraph_config.use_custom_pool", (1, 2), {"use_graph_pool": (1, 2)}),
    (
        "aclgraph_config.disable_reinplace_inplaceable_ops_pass",
        True,
        {"inplace_pass": False},
    ),
    (
        "aclgraph_config.disable_reinplace_input_mutated_ops_pass",
        True,
        {"input_inplace_pass": False},
    ),
    ("dump_config.enable_dump", True, {"dump_tensor_data": True}),
    ("dump_config.dump_path", "dumps", {"data_dump_dir": "dumps"}),
    ("dump_config.dump_step", "0|3-5", {"data_dump_calls": "0|3-5"}),
    ("dump_config.dump_layer", ("mm_1", "add_*"), {"data_dump_nodes": ("mm_1", "add_*")}),
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
]

TORCHAIR_ACLGRAPH_DEBUG = {
    "disable_reinplace_inplaceable_ops_pass": True,
    "disable_reinplace_input_mutated_ops_pass": True,
    "disable_mempool_reuse_in_same_fx": True,
    "enable_output_clone": True,
    "static_capture_size_limit": 16,
    "clone_input": False,
    "remove_cat_ops": False,
}
"""Every field of TorchAir's ``_AclGraphDebugConfig`` (``config.debug.aclgraph``), a value each."""

TORCHAIR_ACLGRAPH_EXPERIMENTAL = {
    "_aclnn_static_shape_kernel": True,
    "_aclnn_static_shape_kernel_build_dir": "/tmp/kernels",
    "_aclnn_static_shape_kernel_sym_value_range": [1, 64],
    "_aclnn_static_shape_kernel_sym_index": 0,
    "_super_kernel_optimize": True,
    "_super_kernel_optimize_options": {"x": 1},
    "_super_kernel_debug_options": {"y": 1},
}
"""Every field of TorchAir's ``_AclGraphExperimentalConfig``
(``config.experimental_config.aclgraph``)."""

NEGATED = [
    ("debug.aclgraph.disable_reinplace_inplaceable_ops_pass", "inplace_pass"),
    ("debug.aclgraph.disable_reinplace_input_mutated_ops_pass", "input_inplace_pass"),
    ("debug.aclgraph.disable_mempool_reuse_in_same_fx", "reuse_graph_pool_in_same_fx"),
    ("aclgraph_config.disable_reinplace_inplaceable_ops_pass", "inplace_pass"),
    ("aclgraph_config.disable_reinplace_input_mutated_ops_pass", "input_inplace_pass"),
]

ACLGRAPH_NAMES = ", ".join(sorted(TORCHAIR_ACLGRAPH_DEBUG))
TOP_NAMES = ", ".join(
    sorted(
        {"_vllm_aclnn_static_kernel_sym_index", "_vllm_aclnn_static_kernel_sym_range"}
        | {"aclgraph_config", "debug", "dump_config", "experimental_config", "mode"}
        | {"post_grad_custom_post_pass", "post_grad_custom_pre_pass"}
        | {
            "force_eager", "force_recapture", "capture_limit", "clone_input", "clone_output",
            "frozen_parameter", "use_graph_pool", "reuse_graph_pool_in_same_fx",
            "capture_error_mode", "static_kernel_compile", "disable_static_kernel_compile_cache",
            "remove_noop_ops", "remove_cat_ops", "inplace_pass", "input_inplace_pass",
            "pattern_fusion_pass", "dump_tensor_data", "data_dump_stage", "data_dump_dir",
            "deadlock_check", "super_kernel_optimize", "super_kernel_optimize_options",
            "super_kernel_debug_options",
        }
    )
)  # fmt: skip


def test_unset_config_gives_defaults() -> None:
    config = CompilerConfig()
    assert config.to_options() == {}
    assert config.to_config() == Config()


@pytest.mark.parametrize(("spelling", "value", "options"), MAPPINGS)
def test_spelling_maps_to_option(spelling: str, value: Any, options: dict[str, Any]) -> None:
    config = CompilerConfig()
    set_path(config, spelling, value)
    assert get_path(config, spelling) == value
    assert config.to_options() == options
    flat = config.to_config()
    for name, expected in options.items():
        assert getattr(flat, name) == expected
    assert flat == Config.from_options(options)


@pytest.mark.parametrize(("spelling", "option"), NEGATED)
def test_negated_false_enables_option(spelling: str, option: str) -> None:
    config = CompilerConfig()
    set_path(config, spelling, False)
    assert config.to_options() == {option: True}


@pytest.mark.parametrize(("spelling", "option"), NEGATED)
def test_negated_spelling_rejects_non_bool(spelling: str, option: str) -> None:
    config = CompilerConfig()
    set_path(config, spelling, 1)
    with pytest.raises(ConfigTypeError) as info:
        config.to_options()
    assert str(info.value) == f"CompilerConfig().{spelling} must be a bool (True or False), got 1"
    assert info.value.option == option


@pytest.mark.parametrize(
    ("spelling", "default"),
    [
        ("mode", "npugraph_ex"),
        ("debug.run_eagerly", False),
        ("debug.aclgraph.clone_input", True),
        ("debug.aclgraph.static_capture_size_limit", 64),
        ("debug.aclgraph.disable_mempool_reuse_in_same_fx", False),
        ("aclgraph_config.disable_reinplace_inplaceable_ops_pass", False),
        ("aclgraph_config.use_custom_pool", None),
        ("debug.graph_dump.type", None),
        ("debug.graph_dump.path", None),
        ("dump_config.dump_path", "./"),
    ],
)
def test_unset_attribute_reads_its_default(spelling: str, default: Any) -> None:
    assert get_path(CompilerConfig(), spelling) == default


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


def test_graph_dump_type_py_is_only_recorded() -> None:
    config = CompilerConfig()
    config.debug.graph_dump.type = "py"
    assert config.debug.graph_dump.type == "py"
    assert config.to_options() == {}


@pytest.mark.parametrize("kind", ["txt", "pbtxt", "json"])
def test_graph_dump_types_other_than_py_are_refused(kind: str) -> None:
    # As TorchAir's aclgraph mode does: its txt and pbtxt dumps are graph-engine formats.
    config = CompilerConfig()
    with pytest.raises(ConfigError) as info:
        config.debug.graph_dump.type = kind
    assert str(info.value) == (
        "CompilerConfig().debug.graph_dump.type must be 'py' (npugraph_ex dumps each FX graph "
        f"as Python; 'txt' and 'pbtxt' are TorchAir's graph-engine formats), got {kind!r}"
    )
    assert config.debug.graph_dump.type is None


@pytest.mark.parametrize(("name", "value"), TORCHAIR_ACLGRAPH_DEBUG.items())
def test_every_torchair_aclgraph_debug_field_is_accepted(name: str, value: Any) -> None:
    config = CompilerConfig()
    setattr(config.debug.aclgraph, name, value)
    assert getattr(config.debug.aclgraph, name) == value
    config.to_config()


@pytest.mark.parametrize(("name", "value"), TORCHAIR_ACLGRAPH_EXPERIMENTAL.items())
def test_every_torchair_aclgraph_experimental_field_is_accepted(name: str, value: Any) -> None:
    config = CompilerConfig()
    setattr(config.experimental_config.aclgraph, name, value)
    assert getattr(config.experimental_config.aclgraph, name) == value
    config.to_config()


def test_torchair_debug_groups_are_accepted() -> None:
    config = CompilerConfig()
    config.debug.data_dump.type = "npy"
    config.debug.data_dump.filter = lambda op: True
    config.debug.data_dump.path = "."
    config.debug.fx_summary.type = "csv"
    config.debug.fx_summary.skip_compile = False
    assert config.to_options() == {}


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
    assert str(info.value) == (
        "CompilerConfig().dump_config has no option 'zzz'. Valid names here: dump_layer, "
        "dump_path, dump_step, enable_dump"
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
    assert second.debug.run_eagerly is False
    clone = copy.deepcopy(first)
    clone.debug.aclgraph.static_capture_size_limit = 2
    assert first.to_options() == {"force_eager": True}
    assert clone.to_options() == {"force_eager": True, "capture_limit": 2}


def test_to_config_surfaces_validation_errors() -> None:
    config = CompilerConfig()
    config.debug.aclgraph.static_capture_size_limit = 0
    assert config.to_options() == {"capture_limit": 0}
    with pytest.raises(ConfigError) as info:
        config.to_config()
    assert str(info.value) == (
        "capture_limit must be an int >= 1, got 0 (options={'capture_limit': 0})"
    )
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == [
            "(set as CompilerConfig().debug.aclgraph.static_capture_size_limit)"
        ]


def test_reduce_overhead_mode_is_kept_and_warns() -> None:
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    assert config.to_options() == {"mode": "reduce-overhead"}
    with pytest.warns(FutureWarning, match="mode='reduce-overhead' is deprecated"):
        assert config.to_config().mode == "npugraph_ex"


def test_repr_shows_what_was_set() -> None:
    config = CompilerConfig()
    config.debug.run_eagerly = True
    assert repr(config) == "CompilerConfig(debug.run_eagerly=True)"


def test_get_npu_backend_rejects_custom_decompositions() -> None:
    with pytest.raises(ConfigError, match="custom_decompositions are not supported") as info:
        get_npu_backend(custom_decompositions={"aten.gelu": lambda x: x})
    assert "post_grad_custom_pre_pass" in str(info.value)
    with pytest.raises(ConfigTypeError, match="custom_decompositions must be a dict or None"):
        get_npu_backend(custom_decompositions=["aten.gelu"])  # type: ignore[arg-type]


def test_get_npu_backend_validates_before_compiling() -> None:
    config = CompilerConfig()
    config.debug.aclgraph.clone_input = "yes"
    with pytest.raises(ConfigTypeError, match="clone_input must be a bool"):
        get_npu_backend(compiler_config=config)
    with pytest.raises(ConfigTypeError, match="compiler_config must be a CompilerConfig or None"):
        get_npu_backend(compiler_config={"mode": "npugraph_ex"})  # type: ignore[arg-type]


@pytest.mark.parametrize(("spelling", "value", "options"), MAPPINGS[:8])
def test_get_npu_backend_passes_mapped_options(
    spelling: str, value: Any, options: dict[str, Any]
) -> None:
    pytest.importorskip("npugraph_ex.dynamo_backend")
    config = CompilerConfig()
    set_path(config, spelling, value)
    compiled = get_npu_backend(compiler_config=config, custom_decompositions={})
    assert callable(compiled)
    assert isinstance(compiled, ConfiguredBackend)
    assert compiled.options == options


def test_get_npu_backend_without_config() -> None:
    pytest.importorskip("npugraph_ex.dynamo_backend")
    assert get_npu_backend().options == {}


def kept_after_next_call(backend: Any, **compile_kwargs: Any) -> bool:
    """Whether an output stays as it was after the next call (``clone_output``), or is
    overwritten by the replay that reuses the graph's memory (the default)."""
    import torch

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, **compile_kwargs)
    with torch.no_grad():
        compiled(torch.ones(4))  # captured
        first = compiled(torch.ones(4))  # replayed
        compiled(torch.full((4,), 3.0))
    return torch.equal(first, torch.full((4,), 2.0))


def output_clone_config() -> CompilerConfig:
    config = CompilerConfig()
    config.debug.aclgraph.enable_output_clone = True
    return config


def test_options_given_to_torch_compile_merge_with_the_config() -> None:
    backend = get_npu_backend(compiler_config=output_clone_config())
    assert kept_after_next_call(backend, options={"capture_limit": 8})
    assert not kept_after_next_call(get_npu_backend(), options={"capture_limit": 8})


def test_an_option_set_both_ways_takes_the_options_value_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = get_npu_backend(compiler_config=output_clone_config())
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        assert not kept_after_next_call(backend, options={"clone_output": False})
        assert not kept_after_next_call(backend, options={"clone_output": False})
    assert (
        caplog.text.count(
            "torch.compile(options={'clone_output': False}) overrides the CompilerConfig's "
            "clone_output=True; set it in one place only"
        )
        == 1
    )
