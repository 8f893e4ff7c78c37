"""Config: every option accepted with a good value and rejected, with the exact message, for a bad
one; unknown options; the deprecated mode alias; hashing; the once-per-process Ascend warning."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch

import npugraph_ex.config as config_module
from npugraph_ex.config import OPTION_ALIASES, OPTION_NAMES, Config
from npugraph_ex.errors import ConfigError, ConfigTypeError, NpuGraphExError

BOOL = "a bool (True or False)"
MODES = "one of 'npugraph_ex', 'reduce-overhead', 'max-autotune'"
POOL = "a graph pool handle (e.g. torch.cuda.graph_pool_handle()) or None"
CALLABLE = "a callable taking the FX graph, or None"


def pass_a(graph: Any) -> None:
    """A custom pass that does nothing."""


def pass_b(graph: Any) -> None:
    """Another custom pass that does nothing."""


def exact_gelu(x: Any, approximate: str = "none") -> Any:
    """A decomposition."""
    return x


GELU = torch.ops.aten.gelu.default
DECOMPOSITIONS = "a dict of ATen ops (such as torch.ops.aten.gelu.default) to callables, or None"


# name, a good non-default value, how it is stored, a bad value, what the message says is allowed,
# the exception type. One row per option; test_table_covers_every_option keeps it complete.
OPTIONS = [
    ("mode", "max-autotune", "max-autotune", "fast", MODES, ConfigError),
    ("force_eager", True, True, 1, BOOL, ConfigTypeError),
    ("force_recapture", True, True, "True", BOOL, ConfigTypeError),
    ("capture_limit", 3, 3, 0, "an int >= 1", ConfigError),
    ("clone_input", False, False, 0, BOOL, ConfigTypeError),
    ("clone_output", True, True, None, BOOL, ConfigTypeError),
    ("frozen_parameter", True, True, 1.0, BOOL, ConfigTypeError),
    ("use_graph_pool", (1, 2), (1, 2), "pool", POOL, ConfigTypeError),
    ("reuse_graph_pool_in_same_fx", False, False, "no", BOOL, ConfigTypeError),
    (
        "capture_error_mode",
        "relaxed",
        "relaxed",
        "local",
        "one of 'global', 'thread_local', 'relaxed'",
        ConfigError,
    ),
    ("num_warmup_iters", 0, 0, -1, "an int >= 0", ConfigError),
    (
        "static_kernel_compile",
        True,
        True,
        1,
        "True, False, 'background' or None (the device's default)",
        ConfigTypeError,
    ),
    ("background_compile_after", 3, 3, 0, "an int >= 1", ConfigError),
    ("background_compiles_in_flight", 2, 2, 0, "an int >= 1", ConfigError),
    ("background_min_gain", 2, 2.0, 0, "a number > 0 (int or float)", ConfigError),
    ("background_cores", 0, 0, -1, "an int >= 0", ConfigError),
    ("background_compile_seconds", 30, 30.0, 0, "a number > 0 (int or float)", ConfigError),
    ("disable_static_kernel_compile_cache", True, True, 1, BOOL, ConfigTypeError),
    ("static_kernel_sym_index", 2, 2, -1, "an int >= 0", ConfigError),
    (
        "static_kernel_sym_values",
        [1, 8],
        (1, 8),
        [1, "8"],
        "a list or tuple of ints, or None",
        ConfigTypeError,
    ),
    ("remove_noop_ops", False, False, 0, BOOL, ConfigTypeError),
    ("remove_cat_ops", False, False, 0, BOOL, ConfigTypeError),
    ("inplace_pass", False, False, 0, BOOL, ConfigTypeError),
    ("input_inplace_pass", False, False, 0, BOOL, ConfigTypeError),
    ("pattern_fusion_pass", False, False, 0, BOOL, ConfigTypeError),
    ("post_grad_custom_pre_pass", pass_a, pass_a, "mod.fn", CALLABLE, ConfigTypeError),
    ("post_grad_custom_post_pass", pass_b, pass_b, 3, CALLABLE, ConfigTypeError),
    (
        "custom_decompositions",
        {GELU: exact_gelu},
        {GELU: exact_gelu},
        [GELU],
        DECOMPOSITIONS,
        ConfigTypeError,
    ),
    ("dump_tensor_data", True, True, 1, BOOL, ConfigTypeError),
    (
        "data_dump_stage",
        "original",
        "original",
        "final",
        "one of 'original', 'optimized'",
        ConfigError,
    ),
    ("data_dump_dir", pathlib.Path("dumps"), "dumps", 3, "a str or os.PathLike", ConfigTypeError),
    (
        "data_dump_nodes",
        ["aten.mm.*", "add_1"],
        ("aten.mm.*", "add_1"),
        [3],
        "a list or tuple of patterns (str), or one str of them",
        ConfigTypeError,
    ),
    ("data_dump_calls", "0|2-4", "0|2-4", 2, "a str of calls such as '0|2-4'", ConfigTypeError),
    ("deadlock_check", True, True, 1, BOOL, ConfigTypeError),
    ("super_kernel_optimize", True, True, 1, BOOL, ConfigTypeError),
    (
        "super_kernel_optimize_options",
        {"a": 1},
        {"a": 1},
        [("a", 1)],
        "a dict or None",
        ConfigTypeError,
    ),
    ("super_kernel_debug_options", {"b": 2}, {"b": 2}, "b=2", "a dict or None", ConfigTypeError),
    ("strict_capture", True, True, 1, BOOL, ConfigTypeError),
    ("strict_passes", True, True, 1, BOOL, ConfigTypeError),
    (
        "disabled_passes",
        ["remove_noop"],
        ("remove_noop",),
        "remove_noop",
        "a list or tuple of pass names (str)",
        ConfigTypeError,
    ),
    (
        "disabled_build_steps",
        ["place"],
        ("place",),
        ["bind_kernels"],
        "a list or tuple of build step names from ('fold_constants', 'place', 'share_views')",
        ConfigError,
    ),
    (
        "debug_dump_dir",
        pathlib.Path("graphs"),
        "graphs",
        5,
        "a str, os.PathLike or None",
        ConfigTypeError,
    ),
]

# More bad values for the options whose type rules have corner cases.
MORE_BAD = [
    ("capture_limit", True, "an int >= 1", ConfigTypeError),
    ("capture_limit", "3", "an int >= 1", ConfigTypeError),
    ("capture_limit", 2.0, "an int >= 1", ConfigTypeError),
    ("num_warmup_iters", False, "an int >= 0", ConfigTypeError),
    ("mode", None, MODES, ConfigTypeError),
    ("use_graph_pool", True, POOL, ConfigTypeError),
    ("use_graph_pool", 3, POOL, ConfigTypeError),
    ("use_graph_pool", 1.5, POOL, ConfigTypeError),
    ("use_graph_pool", [1, 2], POOL, ConfigTypeError),
    ("use_graph_pool", {"id": 1}, POOL, ConfigTypeError),
    ("disabled_passes", ["ok", 3], "a list or tuple of pass names (str)", ConfigTypeError),
    ("data_dump_dir", None, "a str or os.PathLike", ConfigTypeError),
    ("data_dump_dir", b"dumps", "a str or os.PathLike", ConfigTypeError),
    ("static_kernel_sym_index", True, "an int >= 0", ConfigTypeError),
    ("static_kernel_sym_values", 8, "a list or tuple of ints, or None", ConfigTypeError),
    ("static_kernel_sym_values", [True], "a list or tuple of ints, or None", ConfigTypeError),
    ("custom_decompositions", {"aten.gelu": exact_gelu}, DECOMPOSITIONS, ConfigTypeError),
    ("custom_decompositions", {GELU: "exact_gelu"}, DECOMPOSITIONS, ConfigTypeError),
]

HASH_EXEMPT = {"use_graph_pool", "data_dump_dir", "debug_dump_dir"}


def expected_message(name: str, allowed: str, value: Any) -> str:
    return f"{name} must be {allowed}, got {value!r} (options={ {name: value}!r})"


def test_table_covers_every_option() -> None:
    assert sorted(row[0] for row in OPTIONS) == sorted(OPTION_NAMES)


def test_defaults() -> None:
    config = Config.from_options(None)
    assert config == Config() == Config.from_options({})
    assert config.to_options() == {}
    assert config.mode == "npugraph_ex"
    assert config.capture_limit == 64
    assert config.disabled_passes == ()


@pytest.mark.parametrize(("name", "good", "stored"), [row[:3] for row in OPTIONS])
def test_option_accepted(name: str, good: Any, stored: Any) -> None:
    config = Config.from_options({name: good})
    assert getattr(config, name) == stored
    assert type(getattr(config, name)) is type(stored)
    assert config.to_options() == {name: stored}
    assert Config.from_options(config.to_options()) == config


@pytest.mark.parametrize(
    ("name", "bad", "allowed", "error"),
    [(row[0], *row[3:]) for row in OPTIONS] + MORE_BAD,
)
def test_option_rejected(name: str, bad: Any, allowed: str, error: type[ConfigError]) -> None:
    with pytest.raises(error) as info:
        Config.from_options({name: bad})
    assert str(info.value) == expected_message(name, allowed, bad)
    assert info.value.option == name
    assert isinstance(info.value, (NpuGraphExError, ValueError))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"capture_limit": 0},
            "capture_limit must be an int >= 1, got 0 (options={'capture_limit': 0})",
        ),
        (
            {"capture_error_mode": "local"},
            "capture_error_mode must be one of 'global', 'thread_local', 'relaxed', got 'local' "
            "(options={'capture_error_mode': 'local'})",
        ),
        (
            {"clone_input": 1},
            "clone_input must be a bool (True or False), got 1 (options={'clone_input': 1})",
        ),
    ],
)
def test_documented_messages(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_options(options)
    assert str(info.value) == message


def test_wrong_type_is_also_a_type_error() -> None:
    with pytest.raises(TypeError):
        Config.from_options({"clone_input": 1})
    with pytest.raises(ValueError):
        Config.from_options({"capture_limit": 0})


def test_pool_accepts_none_tuple_and_objects() -> None:
    handle = object()
    assert Config(use_graph_pool=handle).use_graph_pool is handle
    assert Config(use_graph_pool=(0, 7)).use_graph_pool == (0, 7)
    assert Config(use_graph_pool=None).use_graph_pool is None


def test_replace_validates() -> None:
    config = Config(capture_limit=4)
    with pytest.raises(ConfigError, match=r"capture_limit must be an int >= 1, got 0"):
        dataclasses.replace(config, capture_limit=0)
    assert dataclasses.replace(config, capture_limit=5).capture_limit == 5


def test_frozen() -> None:
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.capture_limit = 3  # type: ignore[misc]


def test_dict_options_are_copied() -> None:
    options = {"level": 1}
    config = Config(super_kernel_optimize_options=options)
    options["level"] = 2
    assert config.super_kernel_optimize_options == {"level": 1}


def test_dump_dir_must_exist_when_dumping(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError) as info:
        Config.from_options({"dump_tensor_data": True, "data_dump_dir": missing})
    message = str(info.value)
    assert message.startswith(
        f"data_dump_dir must be an existing directory when dump_tensor_data is True, "
        f"got {str(missing)!r} (options={{'dump_tensor_data': True, 'data_dump_dir': "
    )
    assert "create it first" in message
    assert info.value.option == "data_dump_dir"
    # Not dumping: the folder is not needed yet.
    assert Config(data_dump_dir=missing).data_dump_dir == str(missing)
    assert Config(dump_tensor_data=True, data_dump_dir=tmp_path).data_dump_dir == str(tmp_path)


def test_unknown_option_with_close_match() -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_options({"captur_limit": 3})
    assert str(info.value) == (
        "unknown option 'captur_limit' (options={'captur_limit': 3}); "
        f"did you mean 'capture_limit'? Valid options: {', '.join(sorted(OPTION_NAMES))}"
    )
    assert not isinstance(info.value, TypeError)


@pytest.mark.parametrize("name", ["zzz", 7])
def test_unknown_option_without_close_match(name: Any) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_options({name: 1})
    message = str(info.value)
    assert message.startswith(f"unknown option {name!r} (options={ {name: 1}!r})")
    assert "did you mean" not in message
    assert message.endswith(f"Valid options: {', '.join(sorted(OPTION_NAMES))}")


@pytest.mark.parametrize("options", [["capture_limit"], "capture_limit=3", 3])
def test_options_must_be_a_mapping(options: Any) -> None:
    with pytest.raises(ConfigTypeError) as info:
        Config.from_options(options)
    assert str(info.value) == (
        f"options must be a dict of option names to values, got {type(options).__name__}"
    )


def test_mode_keyword_is_merged() -> None:
    assert Config.from_options(mode="max-autotune").mode == "max-autotune"
    config = Config.from_options({"capture_limit": 2}, mode="max-autotune")
    assert (config.mode, config.capture_limit) == ("max-autotune", 2)
    assert Config.from_options({"mode": "max-autotune"}, mode="max-autotune").mode == "max-autotune"


def test_mode_keyword_conflict() -> None:
    with pytest.raises(ConfigError, match=r"mode='max-autotune' conflicts with options\['mode'\]"):
        Config.from_options({"mode": "npugraph_ex"}, mode="max-autotune")


@pytest.mark.parametrize(
    ("options", "mode"),
    [({"mode": "reduce-overhead"}, None), (None, "reduce-overhead"), ({}, "reduce-overhead")],
)
def test_reduce_overhead_is_a_quiet_alias(options: Any, mode: str | None) -> None:
    # TorchAir's older name of the mode, and what Hugging Face's CompileConfig passes.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = Config.from_options(options, mode=mode)
    assert config.mode == "npugraph_ex"
    assert config == Config()


def test_hash_is_stable_for_equal_configs() -> None:
    a = Config(capture_limit=3, post_grad_custom_pre_pass=pass_a, disabled_passes=["x"])
    b = Config.from_options(a.to_options())
    assert a.compute_hash() == b.compute_hash()
    assert len(a.compute_hash()) == 64
    assert int(a.compute_hash(), 16) >= 0


@pytest.mark.parametrize(
    ("name", "good"), [row[:2] for row in OPTIONS if row[0] not in HASH_EXEMPT]
)
def test_hash_changes_with_option(name: str, good: Any) -> None:
    assert Config.from_options({name: good}).compute_hash() != Config().compute_hash()


@pytest.mark.parametrize(("name", "good"), [row[:2] for row in OPTIONS if row[0] in HASH_EXEMPT])
def test_hash_ignores_where_memory_and_files_go(name: str, good: Any) -> None:
    assert Config.from_options({name: good}).compute_hash() == Config().compute_hash()


def test_hash_ignores_pool_object_identity() -> None:
    assert Config(use_graph_pool=object()).compute_hash() == Config().compute_hash()


def test_hash_of_callables_and_dicts() -> None:
    with_a = Config(post_grad_custom_post_pass=pass_a).compute_hash()
    assert with_a == Config(post_grad_custom_post_pass=pass_a).compute_hash()
    assert with_a != Config(post_grad_custom_post_pass=pass_b).compute_hash()
    one = Config(super_kernel_debug_options={"a": 1, "b": 2}).compute_hash()
    assert one == Config(super_kernel_debug_options={"b": 2, "a": 1}).compute_hash()
    assert one != Config(super_kernel_debug_options={"a": 1, "b": 3}).compute_hash()


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout of npugraph_ex."""
    src = str(pathlib.Path(config_module.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )


FRESH_PROCESS_CODE = """
import logging
logging.basicConfig(format="%(levelname)s %(name)s %(message)s")
from npugraph_ex.config import Config
Config()
Config(super_kernel_optimize=True)
Config(super_kernel_debug_options={"trace": True})
Config(super_kernel_optimize_options={})
config = Config(capture_limit=5, post_grad_custom_pre_pass=print, disabled_passes=["a"])
print(config.compute_hash())
"""


@pytest.fixture(scope="module")
def fresh_process() -> subprocess.CompletedProcess[str]:
    """One fresh interpreter for the checks that need process-level state to start empty."""
    return run_python(FRESH_PROCESS_CODE)


def test_hash_is_stable_across_processes(fresh_process: subprocess.CompletedProcess[str]) -> None:
    config = Config(capture_limit=5, post_grad_custom_pre_pass=print, disabled_passes=["a"])
    assert fresh_process.stdout.strip() == config.compute_hash()


def test_ascend_only_warning_is_logged_once_per_process(
    fresh_process: subprocess.CompletedProcess[str],
) -> None:
    lines = [line for line in fresh_process.stderr.splitlines() if "Ascend" in line]
    assert lines == [
        "WARNING npugraph_ex.config Ascend-only options have no effect on this device and are "
        "ignored: super_kernel_optimize (logged once)"
    ]


def test_ascend_only_warning_not_repeated(caplog: pytest.LogCaptureFixture) -> None:
    Config(super_kernel_optimize=True)  # logs here, or already did earlier in this process
    caplog.clear()
    with caplog.at_level("WARNING", logger="npugraph_ex.config"):
        Config(super_kernel_optimize=True, super_kernel_optimize_options={"x": 1})
        Config(super_kernel_debug_options={"y": 2})
    assert [r for r in caplog.records if "Ascend" in r.getMessage()] == []


@pytest.mark.parametrize(("alias", "name"), OPTION_ALIASES.items())
@pytest.mark.parametrize(("value", "stored"), [(0, 0), (3, 3), ([2, 4], (2, 4)), (None, None)])
def test_torchair_names_are_aliases(alias: str, name: str, value: Any, stored: Any) -> None:
    """TorchAir's flat names are the same options: the same checks, the same Config."""
    try:
        expected = Config.from_options({name: value})
    except ConfigError as error:
        with pytest.raises(type(error)) as info:
            Config.from_options({alias: value})
        assert str(info.value) == str(error).replace(name, alias)
        return
    assert Config.from_options({alias: value}) == expected
    assert getattr(expected, name) == stored
    assert Config.from_options({alias: value, name: value}) == expected


def test_an_alias_and_its_option_must_agree() -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_options(
            {"_vllm_aclnn_static_kernel_sym_index": 1, "static_kernel_sym_index": 2}
        )
    assert str(info.value) == (
        "_vllm_aclnn_static_kernel_sym_index=1 conflicts with static_kernel_sym_index=2: both "
        "name option 'static_kernel_sym_index'; give it once"
    )


def test_an_alias_is_a_close_match() -> None:
    with pytest.raises(ConfigError, match="did you mean '_vllm_aclnn_static_kernel_sym_range'"):
        Config.from_options({"_vllm_aclnn_static_kernel_sym_rang": [1]})


@pytest.mark.parametrize(
    ("index", "values", "ints", "chosen"),
    [
        (0, None, [], True),
        (0, None, [7, 3], True),
        (0, (7, 8), [7, 3], True),
        (1, (7, 8), [7, 3], False),
        (1, (3,), [7, 3], True),
        (2, (3,), [7, 3], False),  # past the graph's ints: no key, as in TorchAir
        (0, (), [7], False),
    ],
)
def test_static_kernel_keys_chosen_by_one_int(
    index: int, values: tuple[int, ...] | None, ints: list[int], chosen: bool
) -> None:
    config = Config(static_kernel_sym_index=index, static_kernel_sym_values=values)
    assert config.static_kernels_for(ints) is chosen


def test_decompositions_of_a_packet_cover_each_overload() -> None:
    packet = torch.ops.aten.gelu

    def approximate(x: Any, approximate: str = "none") -> Any:
        return x

    config = Config(custom_decompositions={packet: exact_gelu, packet.default: approximate})
    table = config.custom_decompositions
    assert table == {packet.default: approximate, packet.out: exact_gelu}
    assert Config(custom_decompositions={}).custom_decompositions is None


def test_hash_tells_decompositions_apart() -> None:
    def other_gelu(x: Any, approximate: str = "none") -> Any:
        return x

    one = Config(custom_decompositions={GELU: exact_gelu}).compute_hash()
    assert one == Config(custom_decompositions={GELU: exact_gelu}).compute_hash()
    assert one != Config(custom_decompositions={GELU: other_gelu}).compute_hash()
    silu = torch.ops.aten.silu.default
    assert one != Config(custom_decompositions={silu: exact_gelu}).compute_hash()
