"""Do calls stall while a key moves to compiled kernels, and where?

A model with ``static_kernel_compile="background"``, from a cold Inductor cache (a fresh
``TORCHINDUCTOR_CACHE_DIR``, so the compile process really compiles), timing every call and
labelling it by what its key was doing when the call began:

    not hot    the key replays ATen, not yet hot
    compiling  the compile process compiles (or the key is queued behind another compile)
    load       the call after the reply came: the serving thread loads the kernels after its replay
    warming    the kernels' first run on copies, in a thread
    swap       the kernels' capture and the ATen replay on the same inputs, compared
    trial      both forms timed on real calls
    settled    the form the key kept, the seconds after it settled

beside the same loop with the ATen replay and no compile (``static_kernel_compile=False``), as
long, for the host's own jitter. "Over bound" counts the calls slower than twice that loop's
median plus 1 ms. Workloads (``--workload``): ``token``, the tiny Qwen3's one-token forward
without a KV cache (``dynamic=False``), and ``decode``, its KV-cache decode step. Each setting of
``background_cores`` runs in a fresh process of its own (``--cores 1,0``).

    python benchmarks/background_stalls.py --workload token
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

PHASES = ("not hot", "compiling", "load", "warming", "swap", "trial", "settled", "no compile")


def phase_of(graph: Any) -> str:
    """What the key of ``graph`` (a ``TieredGraph``) is doing as a call begins."""
    from npugraph_ex.capture.tiers import KeyState
    from npugraph_ex.kernels.tier import CompileState

    if graph.state is KeyState.NOT_HOT:
        return "not hot"
    if graph.state is KeyState.QUEUED:
        return "compiling"
    if graph.state is KeyState.PENDING:
        return {
            CompileState.COMPILING: "compiling",
            CompileState.RECEIVED: "load",
            CompileState.WARMING: "warming",
        }.get(graph.compile.state, "swap")
    return "trial" if graph.state is KeyState.TRIAL else "settled"


def workload_calls(workload: str, options: dict[str, Any]) -> Any:
    """A compiled function of the tiny Qwen3 and a function making each call: ``one(fn)`` runs
    one call, returning nothing."""
    import torch
    from transformers import AutoModelForCausalLM

    from npugraph_ex.bench.decode import Decode
    from npugraph_ex.bench.presets import qwen3_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_config("tiny")).eval()
    if workload == "token":
        ids = torch.randint(0, model.config.vocab_size, (1, 1))

        def forward(ids: torch.Tensor) -> torch.Tensor:
            return model(ids, use_cache=False).logits

        fn = torch.compile(forward, backend="npugraph_ex", dynamic=False, options=options)
        return lambda: fn(ids)
    decode = Decode(model, 32, 64, "cpu", lambda: None)
    fn = torch.compile(decode.step(), backend="npugraph_ex", dynamic=False, options=options)
    run = decode.bind(fn)
    run.first(lambda: None)
    positions = iter(())

    def step() -> None:
        nonlocal positions
        position = next(positions, None)
        if position is None:
            run.cache.reset()
            positions = iter(run.positions)
            position = next(positions)
        fn(run.start_ids, position, run.cache)

    return step


def measure(workload: str, cores: int, settled_seconds: float, limit_s: float) -> dict[str, Any]:
    """In this process: every call's seconds by phase, then the reference loop's."""
    import torch

    from npugraph_ex.bench.graphs import live_graph_numbers, managers_since

    options = {"static_kernel_compile": "background", "background_cores": cores}
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}
    before = live_graph_numbers()
    with torch.no_grad():
        call = workload_calls(workload, options)
        call()
        (manager,) = managers_since(before)
        (key,) = manager.entries.values()
        started, settled_at = time.perf_counter(), None
        while time.perf_counter() - started < limit_s:
            phase = phase_of(key.graph)
            call_start = time.perf_counter()
            call()
            times[phase].append(time.perf_counter() - call_start)
            if settled_at is None and key.graph.settled:
                settled_at = time.perf_counter()
            if settled_at is not None and time.perf_counter() - settled_at > settled_seconds:
                break
        state = key.graph.reason
        reference = workload_calls(workload, {"static_kernel_compile": False})
        reference()
        calls = sum(len(t) for phase, t in times.items() if phase != "no compile")
        while len(times["no compile"]) < max(calls, 1000):
            call_start = time.perf_counter()
            reference()
            times["no compile"].append(time.perf_counter() - call_start)
    return {"workload": workload, "cores": cores, "state": state, "times": times}


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
                result["workload"],
                result["cores"],
                phase,
                len(values),
                f"{statistics.median(values) * 1e3:.3f}",
                f"{values[int(0.99 * (len(values) - 1))] * 1e3:.2f}",
                f"{values[-1] * 1e3:.2f}",
                sum(v > 2 * median_replay + 1e-3 for v in values),
            ]
        )
    return rows


def child(workload: str, cores: int, settled_seconds: float, limit_s: float) -> dict[str, Any]:
    """``measure`` in a fresh process with a fresh Inductor cache folder."""
    with tempfile.TemporaryDirectory(prefix="npugraph_ex_stalls_") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        command = [sys.executable, __file__, "--one", str(cores), "--workload", workload]
        command += ["--settled-seconds", str(settled_seconds), "--limit-s", str(limit_s)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="token,decode", help="token and/or decode")
    parser.add_argument("--cores", default="1", help="background_cores settings, in turn")
    parser.add_argument("--settled-seconds", type=float, default=5.0)
    parser.add_argument("--limit-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/background_stalls.json"))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.workload, args.one, args.settled_seconds, args.limit_s)))
        return
    from common import environment, environment_line, format_table, write_json

    results = [
        child(workload, int(c), args.settled_seconds, args.limit_s)
        for workload in args.workload.split(",")
        for c in args.cores.split(",")
    ]
    headers = ["workload", "cores", "phase", "calls", "median ms", "p99 ms", "max ms", "over bound"]
    print(format_table(headers, [row for result in results for row in summary(result)]))
    for result in results:
        print(f"{result['workload']}, background_cores={result['cores']}: {result['state']}")
    print(environment_line(environment()))
    write_json(args.out, "background_stalls", vars(args), results)


if __name__ == "__main__":
    main()
