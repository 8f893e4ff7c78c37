"""Does putting the all_reduces of a tensor-parallel decode step on a stream block pay?

A Qwen3 split over ``--world`` processes (a real gloo group on this machine), decoding two
sequences as two micro-batches (``npugraph_ex.bench.tensor_parallel.TwoBatchStep``). Three
variants of the same step, timed in one interleaved loop on every rank (each timed block starts
at a barrier, from reset caches, and runs ``--steps`` one-token steps):

- *eager*: the step run eagerly, each all_reduce in place;
- *inline*: compiled with npugraph_ex, each all_reduce in place on the main path;
- *overlap*: compiled with npugraph_ex, each all_reduce in a ``stream("comm")`` block, so one
  micro-batch's partial sums travel while the other micro-batch computes.

The figure is inline / overlap per step (above 1: the overlap pays). Rank 0 prints the table and
writes the record; the first step's logits of the two compiled variants are checked equal. Next
to it, one all_reduce of a step's size alone, in wall time and in this process's CPU time: how
much of a collective is work for this host's cores, which an overlap cannot hide when every core
already has a rank.

    python benchmarks/tp_overlap.py
    python benchmarks/tp_overlap.py --preset micro --repeats 9 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from common import (
    QWEN3_PRESETS,
    add_common_args,
    format_table,
    interleaved,
    median,
    print_heading,
    settings_of,
    spread,
    write_json,
)

NAME = "tp_overlap"
CACHE_LENGTH = 64


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME, repeats=7)
    parser.add_argument("--preset", choices=sorted(QWEN3_PRESETS), default="tiny")
    parser.add_argument("--world", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per timed block")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) // args.world)
    return args


def launch(args: argparse.Namespace) -> None:
    """Start every rank of the group; rank 0 reports."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = [a for a in sys.argv[1:] if a not in ("--rank", "--port")]
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, *flags, "--rank", str(r), "--port", str(port)],
            stdout=None if r == 0 else subprocess.DEVNULL,
        )
        for r in range(args.world)
    ]
    codes = [rank.wait() for rank in ranks]
    if any(codes):
        raise SystemExit(f"a rank failed: exit codes {codes}")


def timed_variants(args: argparse.Namespace, rank: int) -> tuple[dict[str, list[float]], bool]:
    from npugraph_ex.bench.presets import build_qwen3
    from npugraph_ex.bench.tensor_parallel import TwoBatchStep, causal_mask, new_caches, shard

    model = build_qwen3(args.preset, seed=0)
    shard(model, rank, args.world, reduce=False)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 1), generator=torch.Generator().manual_seed(1)
    )
    positions = [torch.tensor([p]) for p in range(args.steps)]
    masks = [causal_mask(p, CACHE_LENGTH) for p in positions]
    runs: dict[str, Any] = {}
    first_logits = {}
    for name in ("eager", "inline", "overlap"):
        step = TwoBatchStep(model, overlap=name == "overlap")
        caches = new_caches(model, CACHE_LENGTH)
        step(ids, positions[0], masks[0], caches)  # sets the caches up before any trace
        fn = step if name == "eager" else torch.compile(step, backend="npugraph_ex", fullgraph=True)
        for cache in caches:
            cache.reset()
        first_logits[name] = fn(ids, positions[0], masks[0], caches).clone()
        runs[name] = (fn, caches)

    def block(fn: Any, caches: list[Any]) -> float:
        for cache in caches:
            cache.reset()
        dist.barrier()
        start = time.perf_counter()
        for position, mask in zip(positions, masks, strict=True):
            fn(ids, position, mask, caches)
        return (time.perf_counter() - start) / args.steps

    blocks = {
        name: (lambda fn=fn, caches=caches: block(fn, caches))
        for name, (fn, caches) in runs.items()
    }
    same = torch.equal(first_logits["inline"], first_logits["overlap"])
    return interleaved(blocks, args.repeats), same


def bare_all_reduce(hidden: int, calls: int = 500) -> dict[str, float]:
    """Microseconds of wall and of this process's CPU time per all_reduce of one token's
    hidden state, called back to back."""
    x = torch.randn(1, 1, hidden)
    for _ in range(20):
        dist.all_reduce(x)
    dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        dist.all_reduce(x)
    return {
        "wall_us": (time.perf_counter() - wall) / calls * 1e6,
        "cpu_us": (time.process_time() - cpu) / calls * 1e6,
    }


def run_rank(args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    torch.set_num_threads(args.threads)
    import npugraph_ex  # noqa: F401  (registers the backend)

    with torch.no_grad():
        times, same = timed_variants(args, args.rank)
        collective = bare_all_reduce(QWEN3_PRESETS[args.preset]["hidden_size"])
    everyone: list[Any] = [None] * args.world
    dist.all_gather_object(everyone, {name: median(t) for name, t in times.items()})
    dist.destroy_process_group()
    if args.rank == 0:
        report(args, times, same, everyone, collective)


def report(
    args: argparse.Namespace, times: dict, same: bool, everyone: list, collective: dict
) -> None:
    inline, overlap = median(times["inline"]), median(times["overlap"])
    results = {
        name: {"ms_per_step": median(t) * 1e3, "spread": spread(t), "raw_s": t}
        for name, t in times.items()
    }
    results["inline_over_overlap"] = inline / overlap
    results["eager_over_overlap"] = median(times["eager"]) / overlap
    results["first_step_logits_equal"] = same
    results["per_rank_median_s"] = everyone
    results["bare_all_reduce"] = collective
    print_heading(
        f"{args.world} ranks (gloo), {args.threads} intra-op thread(s) each, Qwen3 "
        f"{args.preset}, two micro-batches, {args.steps} steps per block"
    )
    rows = [
        [
            name,
            f"{r['ms_per_step']:.2f}",
            f"{r['spread']:.0%}",
            f"{inline / median(times[name]):.2f}x",
        ]
        for name, r in results.items()
        if isinstance(r, dict) and "ms_per_step" in r
    ]
    print(format_table(["variant", "ms/step", "spread", "inline / variant"], rows))
    print(f"first-step logits inline == overlap: {same}")
    print(
        f"one all_reduce alone: {collective['wall_us']:.0f} us wall, {collective['cpu_us']:.0f} us "
        "of this process's CPU"
    )
    print(json.dumps({"inline_over_overlap": round(results["inline_over_overlap"], 3)}))
    write_json(args.out, NAME, settings_of(args), results)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.rank is None:
        launch(args)
    else:
        run_rank(args)


if __name__ == "__main__":
    main()
