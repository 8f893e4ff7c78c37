"""What a call costs when the caller holds its outputs across the next call, and a replay's host
time on a GPU.

A micro function with three outputs (``x * 2``, ``x + 1``, ``x.cos()`` on ``--numel`` floats),
compiled with npugraph_ex, called in one interleaved loop (per call):

- dropped: each call's outputs are dropped before the next call (the slot is rewritten in place);
- held: ``out = fn(x)``, so the previous outputs are alive while the next call runs (on CPU the
  graph takes fresh memory for them; on CUDA the held storages are made unreadable);
- clone_output: the same loop with ``clone_output=True`` (a copy of every output per call);
- eager: the plain function, which allocates every output on every call;
- capture manager: the manager called directly, as the wrappers call it (key lookup, input
  copy, replay, outputs), without Dynamo's guards and AOTAutograd's wrapper;
- replay only: the captured graph's bare ``replay()`` (and, on CUDA, the aliases it hands out).

On CUDA the loop is not synchronised per call: with GPU work smaller than the host's per call
(the micro function's kernels take a few microseconds), a call's time is its host time, the
wall time of a replay minus its GPU time. The GPU time of one replay (CUDA events over the
loop) is printed beside it to show that this holds.

    python benchmarks/held_outputs.py
    python benchmarks/held_outputs.py --device cuda --out "$OUT/held_outputs.json"
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from common import (
    add_common_args,
    apply_threads,
    captured_graph,
    format_table,
    interleaved,
    live_graph_numbers,
    median,
    print_heading,
    settings_of,
    spread,
    write_json,
)


def three_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x * 2, x + 1, x.cos()


def loop(fn: Callable[..., Any], x: Any, calls: int, hold: bool, sync: Callable[[], Any]) -> float:
    """Seconds per call of ``calls`` calls, holding each call's outputs until the next or not."""
    sync()
    start = time.perf_counter()
    if hold:
        out = None
        for _ in range(calls):
            out = fn(x)
        del out
    else:
        for _ in range(calls):
            fn(x)
    sync()
    return (time.perf_counter() - start) / calls


def replay(graph: Any) -> list[Any]:
    return graph.replay()


def gpu_seconds_per_call(fn: Callable[..., Any], x: torch.Tensor, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn(x)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--numel", type=int, default=1024, help="floats per input (default 1024)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed block")
    add_common_args(parser, "held_outputs", repeats=7)
    args = parser.parse_args()
    apply_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = torch.randn(args.numel, device=device)

    def compiled(**options: Any) -> Callable[..., Any]:
        return torch.compile(
            three_outputs, backend="npugraph_ex", fullgraph=True, options=options or None
        )

    shared, cloned = compiled(), compiled(clone_output=True)
    calls = args.calls
    with torch.no_grad():
        before = live_graph_numbers()
        for _ in range(3):  # the capture, then replays
            shared(x)
        manager, graph = captured_graph(before)
    blocks = {
        "npugraph_ex, outputs dropped": lambda: loop(shared, x, calls, False, sync),
        "npugraph_ex, outputs held": lambda: loop(shared, x, calls, True, sync),
        "clone_output, outputs held": lambda: loop(cloned, x, calls, True, sync),
        "eager, outputs held": lambda: loop(three_outputs, x, calls, True, sync),
        "capture manager, outputs dropped": lambda: loop(manager, [x], calls, False, sync),
        "replay only, outputs dropped": lambda: loop(replay, graph, calls, False, sync),
    }
    with torch.no_grad():
        times = interleaved(blocks, args.repeats)
        gpu = gpu_seconds_per_call(shared, x, calls) if device.type == "cuda" else None
    rows = [[name, median(t) * 1e6, spread(t)] for name, t in times.items()]
    print_heading(f"three outputs of {args.numel} floats on {device.type}, us per call (median)")
    print(format_table(["variant", "us per call", "spread"], rows))
    if gpu is not None:
        print(f"GPU time of one replay (CUDA events over {calls} replays): {gpu * 1e6:.2f} us")
    results = {"times": times, "gpu_seconds_per_replay": gpu}
    write_json(args.out, "held_outputs", settings_of(args), results)


if __name__ == "__main__":
    main()
