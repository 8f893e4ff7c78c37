"""What does a call cost after the process sat idle, eager, on the ATen replay, on Inductor's
kernels and under plain Inductor, with every thread and with one?

The kernel tier times real calls as they come (``capture/tiers.py``): where calls arrive with
gaps between them, a form whose parallel regions must wake a second thread pays that wake-up in
every call. Each form is called once after each gap, the forms in turn (interleaved), and each
cell is the median of ``--calls`` such calls. Workloads: ``mlp`` (a 16-wide linear layer and a
ReLU on 4 rows) and ``token`` (the tiny Qwen3's one-token forward without a cache). Each thread
count runs in a fresh process of its own.

    python benchmarks/idle_gaps.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GAPS_MS = (0.0, 2.0, 10.0, 50.0)
FORMS = {
    "eager": None,
    "ATen replay": ("npugraph_ex", {"static_kernel_compile": False}),
    "kernels": ("npugraph_ex", {"static_kernel_compile": True}),
    "inductor": ("inductor", {}),
}


def workload(name: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import torch
    from common import qwen3_token_forward

    if name != "mlp":
        return qwen3_token_forward()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return model, (torch.randn(4, 16),)


def measure(name: str, threads: int, calls: int) -> dict[str, dict[str, float]]:
    """In this process: median microseconds a call of each form, per gap."""
    import torch

    torch.set_num_threads(threads)
    fn, args = workload(name)
    forms: dict[str, Callable[[], Any]] = {}
    with torch.no_grad():
        for form, how in FORMS.items():
            if how is None:
                forms[form] = lambda: fn(*args)
                continue
            backend, options = how
            compiled = torch.compile(fn, backend=backend, dynamic=False, options=options or None)
            for _ in range(3):  # capture, compile, first runs
                compiled(*args)
            forms[form] = lambda compiled=compiled: compiled(*args)
        cells: dict[str, dict[str, float]] = {}
        for gap in GAPS_MS:
            times: dict[str, list[float]] = {form: [] for form in forms}
            for _ in range(calls):
                for form, call in forms.items():
                    time.sleep(gap / 1e3)
                    started = time.perf_counter()
                    call()
                    times[form].append(time.perf_counter() - started)
            cells[f"{gap:g} ms"] = {f: statistics.median(t) * 1e6 for f, t in times.items()}
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mlp,token")
    parser.add_argument("--threads", default="2,1", help="intra-op thread counts, in turn")
    parser.add_argument("--calls", type=int, default=41, help="calls of each form per gap")
    parser.add_argument("--out", type=Path, default=Path("bench-results/idle_gaps.json"))
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.calls)))
        return
    from common import environment, environment_line, format_table, write_json

    results: dict[str, Any] = {}
    for name in args.workloads.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            command = [sys.executable, __file__, "--one", name, str(threads)]
            command += ["--calls", str(args.calls)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            results[f"{name}, {threads} thread(s)"] = json.loads(done.stdout.splitlines()[-1])
    headers = ["workload", "gap", *FORMS]
    rows = [
        [key, gap, *(f"{cells[form]:.0f}" for form in FORMS)]
        for key, gaps in results.items()
        for gap, cells in gaps.items()
    ]
    print("median microseconds a call, after the gap")
    print(format_table(headers, rows))
    print(environment_line(environment()))
    write_json(args.out, "idle_gaps", vars(args), results)


if __name__ == "__main__":
    main()
