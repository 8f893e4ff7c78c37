"""``npugraph-ex bench``: one end-to-end run on the micro model, and its argument errors."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npugraph_ex.bench.command import WORKLOADS, add_parser
from npugraph_ex.bench.variants import names_for
from npugraph_ex.cli import main
from npugraph_ex.runtime.cpu import probes as host_probes

ROOT = Path(__file__).resolve().parents[2]

VARIANT_FIELDS = (
    "first_call_s",
    "tokens_per_s",
    "per_repeat_s",
    "speedup_vs_eager",
    "captured_keys",
    "peak_memory_bytes",
    "pool_bytes",
    "tokens_match_eager",
    "max_abs_logit_diff",
)
TOKENS = 3


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    """One small run of the command in a fresh process: its JSON record, stdout and PNG."""
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    folder = tmp_path_factory.mktemp("bench")
    command = [sys.executable, "-m", "npugraph_ex.cli", "bench", "--model", "micro"]
    command += ["--tokens", str(TOKENS), "--steps", "4", "--max-cache-len", "16"]
    command += ["--repeats", "2", "--variants", "eager,npugraph_ex,npugraph_ex+cache_compile"]
    command += ["--workloads", ",".join(WORKLOADS)]
    command += ["--out", str(folder / "bench.json"), "--plot", str(folder / "bench.png")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads((folder / "bench.json").read_text())
    return record, done.stdout, folder / "bench.png"


@pytest.mark.slow
def test_the_record_holds_every_field_for_every_workload(bench_run: tuple) -> None:
    record, _, _ = bench_run
    for key in ("benchmark", "command", "timestamp", "environment", "settings", "workloads"):
        assert key in record
    assert record["command"][:2] == ["npugraph-ex", "bench"]
    probes = record["environment"]["host_probes"]  # what the host's measurement decided
    assert set(probes) == {"split", *host_probes.REDUCTION_NAMES.values()} | {
        f"onednn_linear_{rows}" for rows in host_probes.LINEAR_PROBE_ROWS
    }
    for probe in probes.values():
        assert isinstance(probe["used"], bool) and probe["mm_ms"] > 0 and probe["other_ms"] > 0
    assert record["environment"]["mkl_intel_paths"] in (True, False, None)
    assert set(record["workloads"]) == set(WORKLOADS)
    for workload in record["workloads"].values():
        assert workload["compile_args"]["fullgraph"] is True
        assert list(workload["variants"]) == ["eager", "npugraph_ex", "npugraph_ex+cache_compile"]
        assert workload["compile_args"]["by_variant"]["npugraph_ex+cache_compile"]["cache_compile"]
        for figures in workload["variants"].values():
            assert set(VARIANT_FIELDS) <= set(figures)
            assert len(figures["per_repeat_s"]) == 2
            assert figures["tokens_per_s"] > 0
        assert workload["variants"]["eager"]["speedup_vs_eager"] == 1.0
        assert workload["variants"]["eager"]["captured_keys"] is None


@pytest.mark.slow
def test_npugraph_ex_captures_one_key_per_length_and_one_for_a_fixed_shape(
    bench_run: tuple,
) -> None:
    record, _, _ = bench_run
    growing, decode, token, window = (
        record["workloads"][name] for name in ("growing", "decode", "token", "window")
    )
    assert growing["distinct_lengths"] == TOKENS
    assert growing["compile_args"]["by_variant"]["npugraph_ex"]["options"] == {
        "capture_limit": TOKENS
    }
    assert growing["variants"]["npugraph_ex"]["captured_keys"] == TOKENS
    assert decode["variants"]["npugraph_ex"]["captured_keys"] == 1
    assert token["variants"]["npugraph_ex"]["captured_keys"] == 1
    assert token["steps"] == 4 and token["use_cache"] is False
    assert window["variants"]["npugraph_ex"]["captured_keys"] == 1
    assert window["tokens_per_step"] == 32
    for workload in (growing, decode, token, window):
        assert workload["variants"]["npugraph_ex"]["pool_bytes"] > 0
        cached = workload["variants"]["npugraph_ex+cache_compile"]
        assert cached["captured_keys"] == workload["variants"]["npugraph_ex"]["captured_keys"]


@pytest.mark.slow
def test_greedy_tokens_match_eager(bench_run: tuple) -> None:
    record, stdout, _ = bench_run
    for workload in record["workloads"].values():
        assert workload["variants"]["npugraph_ex"]["tokens_match_eager"] is True
        assert workload["variants"]["npugraph_ex+cache_compile"]["tokens_match_eager"] is True
    rows = [line for line in stdout.splitlines() if line.startswith("| npugraph_ex")]
    assert len(rows) == 2 * len(WORKLOADS)
    assert all(" yes |" in line for line in rows)


@pytest.mark.slow
def test_the_chart_is_a_png(bench_run: tuple) -> None:
    _, stdout, png = bench_run
    assert png.read_bytes().startswith(b"\x89PNG")
    assert f"wrote {png}" in stdout


def exit_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


def test_an_unknown_variant_names_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_message(["bench", "--variants", "eager,npugraph"], capsys)
    assert code == 2
    assert "unknown variant 'npugraph'" in err
    for name in names_for("cpu"):
        assert name in err


def test_a_variant_for_another_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_message(["bench", "--variants", "cudagraphs"], capsys)
    assert code == 2
    assert "'cudagraphs' runs on cuda only" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_message(["bench", "--device", "cuda"], capsys)
    assert code == 2
    assert "--device cuda needs a CUDA device" in err
    assert "--device cpu" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--workloads", "growing,prefill"], "--workloads takes growing, decode, token"),
        (["bench", "--steps", "16", "--max-cache-len", "16"], "--steps must be less than"),
        (["bench", "--tokens", "0"], "expected an int >= 1, got 0"),
        (["bench", "--model", "qwen3-8b"], "expected a preset (tiny, micro, qwen3-0.6b)"),
        ([], "required: command"),
    ],
)
def test_bad_arguments_exit_with_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = exit_message(argv, capsys)
    assert code == 2
    assert message in err


def bench_help() -> str:
    subparsers = argparse.ArgumentParser(prog="npugraph-ex").add_subparsers()
    return add_parser(subparsers).format_help()


def bench_section() -> str:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    start = text.index("## npugraph-ex bench")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def bench_reference() -> str:
    """The bench's reference in ``benchmarks/README.md``: its workloads, variants and flags."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    return text[text.index("## `npugraph-ex bench`: workloads and variants") :]


def test_every_flag_is_documented() -> None:
    flags = set(re.findall(r"--[a-z][a-z-]*", bench_help())) - {"--help"}
    assert {"--model", "--device", "--variants", "--peers", "--no-plot"} <= flags
    documented = bench_section() + bench_reference()
    for flag in sorted(flags):
        assert f"`{flag}" in documented, flag


def test_the_section_leaves_room_for_measured_results() -> None:
    assert "<!-- bench results -->" in bench_section()
