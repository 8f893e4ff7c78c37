"""Where does a replay of the Qwen3 decode step spend its time, kernel by kernel?

The captured step of ``qwen3_decode_step.py`` (one token, ``StaticCache``) is replayed with a
clock around each of its steps, and each step is then timed alone, called back to back. Per ATen
op, the table gives its time per replay in sequence (what a replay really costs) and alone (the
same calls with their data, code and the worker threads warm), and the ratio of the two.

A step that costs far more in sequence than alone is limited by what the steps before it leave
behind: weights evicted from the caches, idle worker threads to wake, cold code paths.

    python benchmarks/replay_kernel_times.py
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from common import (
    captured_graph,
    format_table,
    live_graph_numbers,
    manager_arguments,
    median,
    print_heading,
    with_inputs,
)
from qwen3_decode_step import add_step_args, build, parse_step_args, run_and_record

NAME = "replay_kernel_times"


def in_sequence(
    graph: Any, reset: Callable[[], Any], fill: Callable[[], Any], steps: int
) -> tuple[list[float], float]:
    """Seconds per replay spent in each step, with ``steps`` replays from an empty cache
    (``fill`` copies the inputs into the key's buffers before each, as a replay does)."""
    clock = time.perf_counter
    spent = [0.0] * len(graph.steps)
    reset()
    started = clock()
    with torch._C._AutoDispatchBelowADInplaceOrView():
        for _ in range(steps):
            fill()
            for index, (fn, args, kwargs) in enumerate(graph.steps):
                before = clock()
                fn(*args, **kwargs)
                spent[index] += clock() - before
    wall = (clock() - started) / steps
    return [s / steps for s in spent], wall


def alone(graph: Any, reset: Callable[[], Any], calls: int) -> list[float]:
    """Seconds per call of each step called ``calls`` times back to back (cache reset and inputs
    copied in first, so steps that advance a position stay in range)."""
    times = []
    with torch._C._AutoDispatchBelowADInplaceOrView():
        for fn, args, kwargs in graph.steps:
            reset()
            fn(*args, **kwargs)
            started = time.perf_counter()
            for _ in range(calls):
                fn(*args, **kwargs)
            times.append((time.perf_counter() - started) / calls)
    return times


def by_op(names: list[str], seconds: list[float]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for name, s in zip(names, seconds, strict=True):
        totals[name] += s
    return totals


def run_preset(preset: str, args: argparse.Namespace) -> dict[str, Any]:
    bench = build(preset, args.max_cache_len, args.seed, args.family)
    cache = bench.new_cache()
    before = live_graph_numbers()
    bench.compiled(torch.tensor([[1]]), torch.tensor([0]), cache)
    manager, _ = captured_graph(before)
    manager, call_args = manager_arguments(
        [manager], lambda: bench.compiled(torch.tensor([[1]]), torch.tensor([1]), cache)
    )
    graph = next(iter(manager.entries.values())).graph
    fill = with_inputs(manager, call_args, lambda: None)

    def reset() -> None:
        cache.reset()
        fill()

    sequence_runs, walls, alone_runs = [], [], []
    for _ in range(args.repeats):
        spent, wall = in_sequence(graph, reset, fill, args.steps)
        sequence_runs.append(spent)
        walls.append(wall)
        alone_runs.append(alone(graph, reset, args.calls))
    names = graph.step_names
    sequence = by_op(names, [median(col) for col in zip(*sequence_runs, strict=True)])
    isolated = by_op(names, [median(col) for col in zip(*alone_runs, strict=True)])
    ops = sorted(sequence, key=sequence.get, reverse=True)
    return {
        "preset": preset,
        "steps_per_replay": len(names),
        "replay_ms": round(median(walls) * 1e3, 4),
        "ops": [
            {
                "op": op,
                "count": names.count(op),
                "in_sequence_us": round(sequence[op] * 1e6, 2),
                "alone_us": round(isolated[op] * 1e6, 2),
            }
            for op in ops
        ],
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print_heading(
        f"median of {args.repeats} repeats; {args.steps} replays per repeat in sequence, "
        f"{args.calls} calls per step alone"
    )
    headers = ["op", "steps", "in sequence us", "alone us", "sequence/alone", "share"]
    for r in results:
        total = sum(op["in_sequence_us"] for op in r["ops"])
        alone_total = sum(op["alone_us"] for op in r["ops"])
        rows = [
            [o["op"], o["count"], o["in_sequence_us"], o["alone_us"],
             f"{o['in_sequence_us'] / o['alone_us']:.1f}x", f"{o['in_sequence_us'] / total:.0%}"]
            for o in r["ops"][: args.top]
        ]  # fmt: skip
        rows.append(["all steps", r["steps_per_replay"], round(total, 1), round(alone_total, 1),
                     f"{total / alone_total:.1f}x", "100%"])  # fmt: skip
        print(f"\n{r['preset']}: replay {r['replay_ms']} ms (timed steps included)")
        print(format_table(headers, rows))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_step_args(parser)
    parser.add_argument("--calls", type=int, default=50, help="calls per step when timed alone")
    parser.add_argument("--top", type=int, default=12, help="ops listed (the rest are summed)")
    return parse_step_args(parser, argv, NAME, repeats=5)


def main(argv: list[str] | None = None) -> None:
    run_and_record(parse_args(argv), NAME, run_preset, report)


if __name__ == "__main__":
    main()
