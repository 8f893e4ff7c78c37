"""How much does the CPU replay gain by running its steps as one generated function?

The captured Qwen3 decode step of ``qwen3_decode_step.py`` replays its recorded kernels through a
function generated at capture, one line per kernel (``npugraph_ex/runtime/cpu/program.py``). Here
the same steps, on the same tensors, run two ways in one interleaved loop:

- generated: the graph's generated function;
- step loop: a plain loop over ``(fn, args, kwargs)``.

Both run below autograd, as a replay does, and both leave out the replay's other work (pool lock,
output aliases). The clock is the thread's CPU time, which a busy virtual machine's stolen time
does not inflate: the difference sought is a few percent, under the wall clock's noise here.

    python benchmarks/generated_replay.py
"""

from __future__ import annotations

import argparse
import time

import torch
from common import (
    add_common_args,
    apply_threads,
    captured_graph,
    format_table,
    interleaved,
    live_graph_numbers,
    manager_arguments,
    median,
    print_heading,
    scaled,
    settings_of,
    spread,
    step_loop,
    with_inputs,
    write_json,
)
from qwen3_decode_step import bare_block, build

NAME = "generated_replay"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--replays", type=int, default=100, help="replays per timed block")
    add_common_args(parser, NAME, repeats=15)
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    # The step runs at positions 0, 1 and 2 before timing: the cache holds at least three.
    bench = build(args.preset, max_cache_len=max(args.replays, 2) + 1, seed=0)
    cache, before = bench.new_cache(), live_graph_numbers()
    with torch.no_grad():
        bench.compiled(torch.tensor([[1]]), torch.tensor([0]), cache)
        bench.compiled(torch.tensor([[1]]), torch.tensor([1]), cache)  # a replay: memory placed
        manager, _ = captured_graph(before)
        manager, call_args = manager_arguments(
            [manager], lambda: bench.compiled(torch.tensor([[1]]), torch.tensor([2]), cache)
        )
    graph = next(iter(manager.entries.values())).graph
    # Both run below autograd, as a replay does: ``run_steps`` calls the generated function.
    # Each copies the step's inputs into the key's buffers first, as a replay does.
    generated = with_inputs(manager, call_args, graph.run_steps)
    looped = with_inputs(manager, call_args, step_loop(graph))
    blocks = {
        "generated": bare_block(generated, cache, args.replays, clock=time.thread_time),
        "step loop": bare_block(looped, cache, args.replays, clock=time.thread_time),
    }
    times = interleaved(blocks, args.repeats, warmup=1)
    us = {name: median(ts) * 1e6 for name, ts in times.items()}
    result = {
        "preset": args.preset,
        "steps_per_replay": len(graph.steps),
        "median_us": {name: round(v, 2) for name, v in us.items()},
        "per_repeat_us": {name: scaled(ts, 1e6, 2) for name, ts in times.items()},
        "spread": {name: round(spread(ts), 3) for name, ts in times.items()},
        "saved_us_per_replay": round(us["step loop"] - us["generated"], 2),
    }
    print_heading(
        f"{args.preset} decode step, {len(graph.steps)} steps per replay; thread CPU time, "
        f"median of {args.repeats} interleaved blocks of {args.replays} replays"
    )
    rows = [[name, round(us[name], 1), f"{spread(times[name]) * 100:.0f}%"] for name in blocks]
    print(format_table(["variant", "us per replay", "spread"], rows))
    print(
        f"generated saves {result['saved_us_per_replay']} us per replay "
        f"({us['step loop'] / us['generated']:.3f}x)"
    )
    write_json(args.out, NAME, settings_of(args), [result])


if __name__ == "__main__":
    main()
