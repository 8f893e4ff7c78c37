"""What is the least a batch-1 Qwen3 decode step can cost here: its weights' matrix products?

A one-token decode step multiplies one row by every weight matrix of the model; with fp32
weights larger than the caches, that alone is a floor no graph runtime, fusion or kernel
compiler removes. Timed in one interleaved loop, per decode step:

- eager: the plain step (``StaticCache``, as in ``qwen3_decode_step.py``);
- npugraph_ex: the step compiled with ``backend="npugraph_ex"``;
- weights only: ``torch.mm`` of a one-row input by each ``nn.Linear`` weight of the model, in
  model order, into preallocated outputs (the matrix products a step cannot skip, nothing else).

eager / weights-only is the most any method keeping the same weights and ATen's matrix kernels
can gain on this machine; bytes / time is the bandwidth those products reach.

    python benchmarks/decode_floor.py
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from common import (
    format_table,
    interleaved,
    median,
    print_heading,
    scaled,
    spread,
)
from qwen3_decode_step import add_step_args, build, parse_step_args, run_and_record, step_block

NAME = "decode_floor"


def weights_block(model: torch.nn.Module, steps: int) -> tuple[Any, int]:
    """A timed block of ``steps`` passes over every linear weight, and the bytes one pass reads."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    rows = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    products = [(rows[w.shape[1]], w.t(), torch.empty(1, w.shape[0])) for w in weights]

    def block() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            for row, weight, out in products:
                torch.mm(row, weight, out=out)
        return (time.perf_counter() - start) / steps

    return block, sum(w.numel() * w.element_size() for w in weights)


def run_preset(preset: str, args: argparse.Namespace) -> dict[str, Any]:
    bench = build(preset, args.max_cache_len, args.seed, args.family)
    eager_cache, compiled_cache = bench.new_cache(), bench.new_cache()
    bench.compiled(torch.tensor([[1]]), torch.tensor([0]), compiled_cache)
    weights, weight_bytes = weights_block(bench.model, args.steps)
    blocks = {
        "eager": step_block(bench.step, eager_cache, args.steps),
        "npugraph_ex": step_block(bench.compiled, compiled_cache, args.steps),
        "weights only": weights,
    }
    times = interleaved(blocks, args.repeats, warmup=1)
    medians = {name: median(ts) for name, ts in times.items()}
    return {
        "preset": preset,
        "weight_bytes": weight_bytes,
        "per_repeat_ms": {name: scaled(ts, 1e3) for name, ts in times.items()},
        "median_ms": {name: round(t * 1e3, 4) for name, t in medians.items()},
        "spread": {name: round(spread(ts), 3) for name, ts in times.items()},
        "weights_gb_per_s": round(weight_bytes / medians["weights only"] / 1e9, 2),
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print_heading(f"median of {args.repeats} interleaved repeats of {args.steps} steps each")
    headers = ["preset", "weights MB", "eager ms", "npugraph_ex ms", "weights only ms",
               "eager/weights", "eager/npugraph_ex", "weights GB/s", "spread"]  # fmt: skip
    rows = []
    for r in results:
        ms = r["median_ms"]
        rows.append([
            r["preset"], round(r["weight_bytes"] / 1e6, 1), ms["eager"], ms["npugraph_ex"],
            ms["weights only"], f"{ms['eager'] / ms['weights only']:.2f}x",
            f"{ms['eager'] / ms['npugraph_ex']:.2f}x", r["weights_gb_per_s"],
            f"{max(r['spread'].values()) * 100:.0f}%",
        ])  # fmt: skip
    print(format_table(headers, rows))
    print("\neager/weights = the most a method keeping these weights and ATen's matrix kernels "
          "can gain.")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_step_args(parser)
    return parse_step_args(parser, argv, NAME, repeats=15)


def main(argv: list[str] | None = None) -> None:
    run_and_record(parse_args(argv), NAME, run_preset, report)


if __name__ == "__main__":
    main()
