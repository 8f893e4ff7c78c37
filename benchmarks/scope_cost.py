"""What does a scope block cost a CPU replay, and does ``limit_core_num`` reach the kernels?

Three workloads, each compiled three ways and timed in one interleaved loop (median per call):

- *one op*: ``x + 1`` on 16 floats: what handing a block to another thread and joining it costs
  (a stream block runs on its tag's worker), against the op alone;
- *chain*: 50 tiny elementwise ops on 16 floats, where a call is nearly all host cost: compiled
  plain, inside ``stream("s")`` and inside ``limit_core_num(1, 1)``. The difference to plain is
  what the block's two edges cost a replay (the second also sets the thread count twice);
- *product*: a 1024 x 1024 float32 matrix product, whose kernel is parallel: plain, inside
  ``stream`` and inside ``limit_core_num(1, 1)``. With more than one intra-op thread, the
  limited block runs the kernel on one, so it takes longer by up to the thread count.

    python benchmarks/scope_cost.py
    python benchmarks/scope_cost.py --repeats 30 --threads 2
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from common import (
    add_common_args,
    apply_threads,
    format_table,
    interleaved,
    median,
    print_heading,
    settings_of,
    spread,
    time_calls,
    write_json,
)

from npugraph_ex.scope import limit_core_num, stream

NAME = "scope_cost"
CHAIN_OPS = 50


def chain(x: torch.Tensor) -> torch.Tensor:
    for i in range(CHAIN_OPS):
        x = (x + 1, x * 0.5, x - 2, x.relu())[i % 4]
    return x


def one_op(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def product(x: torch.Tensor) -> torch.Tensor:
    return x @ x


def in_block(work: Callable[[torch.Tensor], torch.Tensor], block: Callable[[], Any]):
    def run(x: torch.Tensor) -> torch.Tensor:
        with block():
            return work(x)

    return run


VARIANTS = {
    "plain": None,
    "stream block": lambda: stream("s"),
    "limit_core_num(1, 1) block": lambda: limit_core_num(1, 1),
}


def time_workload(work: Callable, x: torch.Tensor, calls: int, repeats: int) -> dict[str, Any]:
    blocks = {}
    for name, block in VARIANTS.items():
        fn = work if block is None else in_block(work, block)
        compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
        compiled(x)  # capture
        blocks[name] = lambda compiled=compiled: time_calls(lambda: compiled(x), calls)
    times = interleaved(blocks, repeats)
    plain = median(times["plain"])
    return {
        name: {
            "us": median(t) * 1e6,
            "vs_plain_us": (median(t) - plain) * 1e6,
            "ratio_to_plain": median(t) / plain,
            "spread": spread(t),
            "raw_s": t,
        }
        for name, t in times.items()
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME, repeats=15)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    apply_threads(args.threads)
    with torch.no_grad():
        results = {
            "one op": time_workload(one_op, torch.randn(16), calls=5000, repeats=args.repeats),
            "chain": time_workload(chain, torch.randn(16), calls=2000, repeats=args.repeats),
            "product": time_workload(
                product, torch.randn(1024, 1024), calls=20, repeats=args.repeats
            ),
        }
    print_heading(f"intra-op threads: {torch.get_num_threads()}")
    rows = [
        [
            workload,
            name,
            f"{r['us']:.1f}",
            f"{r['vs_plain_us']:+.1f}",
            f"{r['ratio_to_plain']:.2f}x",
            f"{r['spread']:.0%}",
        ]
        for workload, variants in results.items()
        for name, r in variants.items()
    ]
    print(
        format_table(["workload", "variant", "us/call", "vs plain us", "/ plain", "spread"], rows)
    )
    write_json(args.out, NAME, settings_of(args), results)


if __name__ == "__main__":
    main()
