"""``benchmarks/cuda_check.py``: the GPU check's plan, the tables it keeps and the section it
writes into the docs (its run itself is ``--dry-run`` on CPU, or ``make cuda-check`` on a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import cuda_check  # noqa: E402

BENCH_OUTPUT = """building ...
decode: one-token step (dynamic=False); float16, median of 5 interleaved repeats

| variant | first call s | speed-up |
|---|---:|---:|
| eager | 0.01 | 1.00x |
| npugraph_ex | 2.0 | 3.10x |
npugraph_ex+background: steady after 1.0 s (9 calls; keys: 1 kernels); slowest call 1 ms
first run / first call: compilation and capture included
"""


def test_the_plan_fits_the_budget_and_names_the_peers() -> None:
    planned = cuda_check.steps(Path("out"), dry_run=False)
    assert sum(step.limit_s for step in planned) <= 480
    assert planned[0].name == "cuda tests" and "-m" in planned[0].command
    assert planned[1].name == "held outputs" and "--device cuda" in " ".join(planned[1].command)
    benches = [step for step in planned if "bench" in step.command]
    assert len(benches) == 5 and planned[-1].name == "growing peak"
    assert all("reduce-overhead" in " ".join(step.command) for step in benches)
    dtypes = {step.command[step.command.index("--dtype") + 1] for step in benches}
    assert dtypes == {"float16", "bfloat16"}


def test_the_dry_run_stays_on_the_cpu() -> None:
    for step in cuda_check.steps(Path("out"), dry_run=True)[1:]:
        command = " ".join(step.command)
        assert "--device cpu" in command and "reduce-overhead" not in command


def test_a_bench_table_is_kept_with_its_caption_and_settling_line() -> None:
    (table,) = cuda_check.tables_in(BENCH_OUTPUT)
    assert table.splitlines()[0].startswith("decode: one-token step")
    assert "| npugraph_ex | 2.0 | 3.10x |" in table
    assert table.splitlines()[-1].startswith("npugraph_ex+background: steady after")


def test_the_section_goes_between_its_markers_and_replaces_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n## CUDA: NVIDIA H200\n\nold runs\n")
    monkeypatch.setattr(cuda_check, "DOCS", docs)
    record = {
        "commit": "commit `abc1234`",
        "machine": {"device": "NVIDIA H100", "driver": "550", "cuda": "12.8", "torch": "2.11",
                    "python": "3.11"},
        "seconds": 300.0,
        "steps": [{"name": "cuda tests", "status": "passed", "seconds": 60.0,
                   "tables": ["12 passed in 60 s"]}],
    }  # fmt: skip
    for _ in (1, 2):  # twice: the second replaces the first
        (tmp_path / "cuda_check.md").write_text(cuda_check.section(record) + "\n")
        cuda_check.apply(tmp_path)
    text = docs.read_text()
    assert text.count(cuda_check.BEGIN) == 1 and text.count(cuda_check.END) == 1
    assert "NVIDIA H100, driver 550, CUDA 12.8, torch 2.11" in text
    assert text.index("## CUDA check") < text.index("## CUDA: NVIDIA H200")


def test_the_peak_is_found_with_the_allocations_alive_at_it() -> None:
    import growing_peak

    def entry(action: str, addr: int, mib: int, file: str = "a.py") -> dict:
        frames = [{"filename": "/x/y/" + file, "line": 3, "name": "f"}]
        return {"action": action, "addr": addr, "size": mib << 20, "frames": frames}

    trace = [
        entry("alloc", 1, 10),
        entry("alloc", 2, 100, "mask.py"),
        entry("free_requested", 2, 100),  # still allocated until the free completes
        entry("alloc", 3, 5),
        entry("free_completed", 2, 100),
        entry("free_completed", 99, 7),  # a block allocated before the trace began
        entry("alloc", 4, 50),
    ]
    peak, live = growing_peak.peak_allocations(trace)
    assert peak == 115 << 20
    assert [e["addr"] for e in live] == [2, 1, 3]  # largest first
    assert growing_peak.where(live[0]) == ["x/y/mask.py:3 f"]


def test_the_physical_limit_is_the_weights_over_the_measured_bandwidth(tmp_path: Path) -> None:
    record = tmp_path / "qwen3-0.6b-decode-float16.json"
    record.write_text('{"model": {"parameters": 500000000, "dtype": "float16"}}')
    assert cuda_check.weight_floor(record, 4e12) == (
        "Physical limit: 1.000 GB of float16 weights over 4.00 TB/s (measured device copy) = "
        "0.250 ms per token, at most 4,000 tokens/s."
    )
    assert cuda_check.weight_floor(record, None) is None  # a dry run measures no bandwidth
    assert cuda_check.weight_floor(tmp_path / "absent.json", 4e12) is None
