"""Do calls stall while a background compile runs, and where?

A decode loop (tiny Qwen3, ``StaticCache``, one key) with ``static_kernel_compile="background"``,
from a cold Inductor cache (a fresh ``TORCHINDUCTOR_CACHE_DIR``, so the worker really compiles),
timing every call and labelling it by what ran beside it:

    aten       the key replays ATen, no compile yet
    compiling  the worker process compiles
    loading    the serving process loads the result (the first load in a process probes the
               compiler: about a second)
    trial      both forms timed on real calls
    settled    the form the key kept, the seconds after it settled

beside the same loop with the default replay and no compile, as long, for the host's own jitter.
"Over 2x" counts the calls slower than twice the default replay's median. Each setting of
``background_cores`` runs in a fresh process of its own (``--cores 1,0``: the worker on its own
core, and sharing every core), one after the other.

    python benchmarks/background_stalls.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PHASES = ("aten", "compiling", "loading", "trial", "settled", "no compile")


def measure(cores: int, settled_seconds: float, limit_s: float) -> dict[str, Any]:
    """In this process: every call's seconds by phase, then the reference loop's."""
    import torch
    from transformers import AutoModelForCausalLM

    from npugraph_ex.bench.decode import Decode
    from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
    from npugraph_ex.bench.presets import qwen3_config
    from npugraph_ex.kernels.workers import WORKERS

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_config("tiny")).eval()
    workload = Decode(model, 32, 64, "cpu", lambda: None)
    options = {"static_kernel_compile": "background", "background_cores": cores}
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}

    def phase_of(state: str) -> str:
        if state == "aten":
            return "aten"
        if state == "pending":
            compiling = any(w.future is not None for w in WORKERS.workers)
            return "compiling" if compiling else "loading"
        return "trial" if state == "trial" else "settled"

    before = live_graph_numbers()
    fn = torch.compile(workload.step(), backend="npugraph_ex", dynamic=False, options=options)
    run = workload.bind(fn)
    started, settled_at = time.perf_counter(), None
    with torch.no_grad():
        run.first(lambda: None)
        (manager,) = managers_since(before)
        (key,) = manager.entries.values()
        while time.perf_counter() - started < limit_s:
            run.cache.reset()
            for position in run.positions:
                phase = phase_of(key.graph.state)
                call_start = time.perf_counter()
                fn(run.start_ids, position, run.cache)
                times[phase].append(time.perf_counter() - call_start)
            if settled_at is None and key.graph.settled:
                settled_at = time.perf_counter()
            if settled_at is not None and time.perf_counter() - settled_at > settled_seconds:
                break
        state = key.graph.state
        reference = torch.compile(workload.step(), backend="npugraph_ex", dynamic=False)
        again = workload.bind(reference)
        again.first(lambda: None)
        calls = sum(len(times[p]) for p in ("compiling", "loading"))
        while len(times["no compile"]) < max(calls, 1000):
            again.cache.reset()
            for position in again.positions:
                call_start = time.perf_counter()
                reference(again.start_ids, position, again.cache)
                times["no compile"].append(time.perf_counter() - call_start)
    return {"cores": cores, "state": state, "times": times}


def summary(result: dict[str, Any]) -> list[list[Any]]:
    times = result["times"]
    median_replay = statistics.median(times["no compile"])
    rows = []
    for phase in PHASES:
        values = sorted(times[phase])
        if not values:
            continue
        rows.append(
            [
                result["cores"],
                phase,
                len(values),
                f"{statistics.median(values) * 1e3:.3f}",
                f"{values[int(0.99 * (len(values) - 1))] * 1e3:.2f}",
                f"{values[-1] * 1e3:.2f}",
                sum(v > 2 * median_replay for v in values),
            ]
        )
    return rows


def child(cores: int, settled_seconds: float, limit_s: float) -> dict[str, Any]:
    """``measure`` in a fresh process with a fresh Inductor cache folder."""
    with tempfile.TemporaryDirectory(prefix="npugraph_ex_stalls_") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        command = [sys.executable, __file__, "--one", str(cores)]
        command += ["--settled-seconds", str(settled_seconds), "--limit-s", str(limit_s)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", default="1,0", help="background_cores settings, in turn")
    parser.add_argument("--settled-seconds", type=float, default=5.0)
    parser.add_argument("--limit-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/background_stalls.json"))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.settled_seconds, args.limit_s)))
        return
    from common import environment, environment_line, format_table, write_json

    results = [child(int(c), args.settled_seconds, args.limit_s) for c in args.cores.split(",")]
    headers = ["cores", "phase", "calls", "median ms", "p99 ms", "max ms", "over 2x"]
    print(format_table(headers, [row for result in results for row in summary(result)]))
    for result in results:
        print(f"background_cores={result['cores']}: the key kept {result['state']}")
    print(environment_line(environment()))
    write_json(args.out, "background_stalls", vars(args), results)


if __name__ == "__main__":
    main()
