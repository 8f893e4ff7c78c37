"""Helpers shared by the benchmark scripts: interleaved timing, the environment record, output.

Every ratio a benchmark reports comes from one process and one loop: each repeat runs one timed
block of every variant in turn (A, B, C, A, B, C, ...), so drift in clock speed, cache state or
neighbouring load hits all variants alike. A variant's figure is the median of its repeats; the
raw per-repeat times are written to the JSON record so the spread can be checked.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.capture.stats import LIVE_GRAPHS

QWEN3_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=4096,
    ),
    "micro": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
    ),
}
"""Qwen3 configs (random weights) the benchmarks build: ``tiny`` (4.5M parameters) and ``micro``."""

Block = Callable[[], float]
"""Runs one timed block of a variant and returns the seconds per call it measured."""


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, or what ``platform`` knows elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    """The installed version of ``name``, or None when it is not importable."""
    try:
        module = __import__(name)
    except ImportError:
        return None
    return getattr(module, "__version__", "unknown")


def source_commit() -> str | None:
    """The commit of the checkout ``npugraph_ex`` is imported from, when it is a git checkout."""
    import npugraph_ex

    folder = Path(npugraph_ex.__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def environment() -> dict[str, Any]:
    """Where and with what a result was measured."""
    return {
        "device": cpu_model(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "npugraph_ex": package_version("npugraph_ex"),
        "npugraph_ex_commit": source_commit(),
    }


def live_graph_numbers() -> set[int]:
    """Numbers of the capture managers alive now (pass to ``captured_graph`` later)."""
    return set(LIVE_GRAPHS.keys())


def captured_graph(before: set[int]) -> tuple[Any, Any]:
    """The one capture manager created since ``before`` that holds a capture, and its graph.

    Raises when there is not exactly one such manager with exactly one captured key: the bare
    replay timed next to a compiled call must be the graph that call replays.
    """
    fresh = [LIVE_GRAPHS[n] for n in sorted(LIVE_GRAPHS.keys()) if n not in before]
    live = [m for m in fresh if m.entries]
    if len(live) != 1 or len(live[0].entries) != 1:
        keys = [len(m.entries) for m in live]
        raise RuntimeError(f"expected one captured graph with one key, found keys {keys}")
    manager = live[0]
    return manager, next(iter(manager.entries.values())).graph


def time_calls(fn: Callable[[], Any], calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def interleaved(
    blocks: dict[str, Block], repeats: int, *, warmup: int = 1
) -> dict[str, list[float]]:
    """Run every block once per repeat, in the given order; return seconds per call by variant.

    ``warmup`` untimed rounds of the same loop come first.
    """
    for _ in range(warmup):
        for block in blocks.values():
            block()
    times: dict[str, list[float]] = {name: [] for name in blocks}
    for _ in range(repeats):
        for name, block in blocks.items():
            times[name].append(block())
    return times


def aten_self_times(fn: Callable[[], Any], calls: int) -> tuple[dict[str, float], float]:
    """Self CPU seconds per call of ``fn`` in each ATen op under torch.profiler, and wall seconds.

    Self time leaves out the Python-to-C++ call of each op; the profiler adds a little of its own
    cost to every op it records, and the wall time (of the same profiled calls) includes it.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = (time.perf_counter() - start) / calls
    by_op = {
        event.key: event.self_cpu_time_total * 1e-6 / calls
        for event in prof.key_averages()
        if event.key.startswith("aten::")
    }
    return by_op, wall


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float]) -> float:
    """Relative spread of repeats: (max - min) / median."""
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


def scaled(values: Sequence[float], factor: float, digits: int = 4) -> list[float]:
    """``values`` times ``factor``, rounded for the JSON record."""
    return [round(v * factor, digits) for v in values]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table with right-aligned columns (first column left-aligned)."""
    cells = [[str(h) for h in headers]] + [[cell_text(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join(("-" * (w + 1)) + (":" if i else "-") for i, w in enumerate(widths))
    return "\n".join([line(cells[0]), rule + "|"] + [line(r) for r in cells[1:]])


def cell_text(value: Any) -> str:
    """Floats to three significant figures below 1, else two decimals (one from 100)."""
    if not isinstance(value, float):
        return str(value)
    size = abs(value)
    return f"{value:.3g}" if size < 1 else f"{value:.2f}" if size < 100 else f"{value:.1f}"


def kernels_per_replay(summary: dict[str, Any], graph: Any) -> int | None:
    """Kernels one replay launches, as the graph's stats report it (the graph's own count else).

    Reads ``kernels_per_replay`` (by key) or, where the summary lists its ``keys``, their
    ``kernels``; a graph with one live key has one figure.
    """
    counts = list(summary.get("kernels_per_replay", {}).values())
    counts += [info["kernels"] for info in summary.get("keys", {}).values() if "kernels" in info]
    if len(counts) == 1:
        return counts[0]
    return getattr(graph, "kernel_count", None)


def environment_line(env: dict[str, Any]) -> str:
    return (
        f"device: {env['device']} ({env['cores']} cores, torch threads {env['torch_threads']}); "
        f"python {env['python']}, torch {env['torch']}, transformers {env['transformers']}"
    )


def add_common_args(parser: argparse.ArgumentParser, name: str, repeats: int) -> None:
    """``--repeats``, ``--threads`` and ``--out``, shared by every script."""
    parser.add_argument(
        "--repeats", type=int, default=repeats, help=f"timed rounds (default {repeats})"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results") / f"{name}.json",
        help=f"JSON record to write (default bench-results/{name}.json)",
    )


def apply_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


def write_json(path: Path, name: str, settings: dict[str, Any], results: Any) -> None:
    """Write the record of one run: the benchmark, its settings, the environment, the results."""
    record = {
        "benchmark": name,
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": environment(),
        "settings": settings,
        "results": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"wrote {path}")
