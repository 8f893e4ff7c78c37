"""A TorchAir script runs with only its import changed, in a fresh process: results are eager's,
the custom pass reads the config as in TorchAir, and what differs from TorchAir is said once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).with_name("torchair_script.py")

IGNORED = (
    "experimental_config.topology_sorting_strategy='StableRDFS', "
    "experimental_config.enable_view_optimize=False, "
    "experimental_config.tiling_schedule_optimize=True, ge_config.enable_single_stream=True, "
    "ge_config.oo_level='O1', inference_config.dynamic_gears_merge_policy='product', "
    "aoe_config.aoe_mode='2', fusion_config.fusion_switch_file='{work}/fusion_switch.cfg', "
    "export.experimental.enable_record_nn_module_stack=True"
)


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def script_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, list[str]]:
    """(its work folder, its report, its log lines) of one run of the script."""
    work = tmp_path_factory.mktemp("torchair_script")
    result = run_python(str(SCRIPT), str(work))
    assert result.returncode == 0, result.stderr
    return work, json.loads(result.stdout.splitlines()[-1]), result.stderr.splitlines()


def test_only_the_import_names_npugraph_ex() -> None:
    lines = [line for line in SCRIPT.read_text().splitlines() if "npugraph_ex" in line]
    assert lines == ["import npugraph_ex as torchair"]


def test_results_are_eager_s(script_run: tuple[Path, Any, list[str]]) -> None:
    _, report, _ = script_run
    assert report["worst"] < 1e-5
    assert report["dumps"] > 0 and report["graphs"] > 0  # dump_config and debug.graph_dump


def test_the_custom_pass_reads_torchair_values(script_run: tuple[Path, Any, list[str]]) -> None:
    _, report, _ = script_run
    (reads,) = {json.dumps(r, sort_keys=True) for r in report["reads"]}  # one per graph compiled
    assert json.loads(reads) == {
        "mode": "npugraph_ex",
        "capture_limit": "8",
        "clone_output": "1",
        "frozen_parameter": "1",
        "oo_level": "O1",
        "silu": 0,  # custom_decompositions ran before it
    }


def test_each_difference_is_said_once(script_run: tuple[Path, Any, list[str]]) -> None:
    work, _, lines = script_run
    warnings = [line for line in lines if line.startswith("WARNING npugraph_ex")]
    ignored = (
        "WARNING npugraph_ex.torchair_compat.backend npugraph_ex: these CompilerConfig fields "
        "mean nothing off Ascend's graph engine and are ignored: " + IGNORED.format(work=work)
    )
    assert warnings.count(ignored) == 1
    assert sum("CompilerConfig().mode is not set" in line for line in warnings) == 1


def test_torchair_s_other_spellings_run_as_written(script_run: tuple[Path, Any, list[str]]) -> None:
    # get_compiler under an AOTAutograd backend of one's own, mode "reduce-overhead" (quiet),
    # op_never_timeout, data_dump and limit_core_num(n, 0): results equal eager's (asserted in
    # the script), no warning from Python's warnings.
    _, report, lines = script_run
    assert report["spellings_warned"] == []
    assert report["unbalanced"].startswith("scope_enter(['_user_stream_label'")
    assert "is never closed: no scope_exit after it" in report["unbalanced"]
    # The deadlock check's clean line ends in TorchAir's words.
    assert any(line.endswith("No deadlock risks detected") for line in lines), lines[-20:]


MODE_CODE = """
import logging
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
import npugraph_ex as torchair
config = torchair.CompilerConfig()
config.mode = "npugraph_ex"
torchair.get_npu_backend(compiler_config=config)
torchair.get_npu_backend()
torchair.get_npu_backend(compiler_config=torchair.CompilerConfig())
"""


def test_an_unset_mode_is_said_once_at_info() -> None:
    result = run_python("-c", MODE_CODE)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "mode is not set" in line]
    assert len(lines) == 1
    assert lines[0].startswith(
        "INFO npugraph_ex: CompilerConfig().mode is not set, so graphs are captured and replayed"
    )
