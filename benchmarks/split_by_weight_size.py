"""From what weight size on does splitting a one-row product over the threads pay?

``pattern_fusion_pass`` turns a few-row float32 ``mm`` into a ``bmm`` over the weight's rows cut
into one block per intra-op thread (``npugraph_ex/passes/patterns/row_products.py``). A batched
product wakes the other threads, which costs a few microseconds: small weights lose more than
they gain. For each weight shape, ``--count`` distinct weights of that shape are multiplied by one
row in turn (as a model's layers are), two ways, the way a replay issues them (views made once,
then only the kernels, with ``out=``):

- mm: ``aten.mm.out(x, w.t())``, what the graph runs unsplit;
- split: ``aten.bmm.out(w.view(P, N/P, K), x.t().expand(P, K, 1))``, the pattern's form.

Before each timed block a ``--evict-mb`` buffer is copied (outside the timing), so the weights
come from memory, as in a model whose weights do not fit the CPU caches; ``--evict-mb 0`` times
them warm instead. The ratio per shape shows where the split starts to pay; the CPU platform's
``SPLIT_MIN_WEIGHT_ELEMENTS`` (``npugraph_ex/runtime/cpu/platform.py``) is set from it.

With ``--reduction``, the same question for the static kernels' multiply-and-sum
(``npugraph_ex/kernels/decompositions.py``), which Inductor compiles into a loop over the weight's
rows that it runs in a parallel region: ``--count`` products of ``--rows`` rows by distinct
weights of each shape, as ``F.linear``, eager and compiled with ``static_kernel_compile=True``
twice, once with every product a reduction and once with none (the product is then Inductor's
call of ATen's ``mm``, or from 4 rows oneDNN's linear where the host probe says it pays). The CPU
platform's ``REDUCTION_LARGE_WEIGHT_ELEMENTS`` is set from it.

With ``--decode PRESET``, the same question on a whole decode step (``qwen3_decode_step.py``'s,
``--family`` as there, ``--batch`` sequences): the step compiled once per smallest weight split
(``--thresholds``; ``none`` splits nothing), or with ``--reduction`` on the ATen replay and once
per rule of ``REDUCTION_RULES`` on static kernels, each its own code object and so its own
graph, timed side by side with eager in one interleaved loop.

    python benchmarks/split_by_weight_size.py
    python benchmarks/split_by_weight_size.py --evict-mb 0
    python benchmarks/split_by_weight_size.py --reduction --rows 1 --evict-mb 0
    python benchmarks/split_by_weight_size.py --reduction --rows 8 --shapes 1024x1024 3072x1024
    python benchmarks/split_by_weight_size.py --decode micro
    python benchmarks/split_by_weight_size.py --decode tiny --family qwen2
    python benchmarks/split_by_weight_size.py --decode tiny --reduction --batch 8
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from common import (
    QWEN3_MODELS,
    add_common_args,
    apply_threads,
    attributes_set,
    format_table,
    interleaved,
    median,
    print_heading,
    scaled,
    settings_of,
    spread,
    time_calls,
    write_json,
)
from qwen3_decode_step import FAMILIES, build, step_block

from npugraph_ex.bench.variants import own_code
from npugraph_ex.runtime.cpu import platform as cpu_platform

NAME = "split_by_weight_size"
SHAPES = ((64, 64), (128, 64), (128, 128), (128, 256), (256, 128), (256, 256), (512, 256))
SHAPES += ((256, 512), (1024, 256), (512, 512), (4096, 256))
"""Weight shapes ``(N, K)``: the micro and tiny Qwen3 presets' layer sizes and a few more."""

Blocks = dict[str, Callable[[], Any]]
"""Timed blocks by name."""

FRESH_STATIC_KERNELS = {"static_kernel_compile": True, "disable_static_kernel_compile_cache": True}
"""Static kernels compiled in this process, none taken from the kernel cache (which a compile of
the same graph under another rule may have filled)."""


def product_blocks(rows: int, depth: int, args: argparse.Namespace) -> Blocks:
    """The ``args.count`` one-row products by weights of ``rows x depth``, unsplit and split."""
    parts = torch.get_num_threads()
    weights = [torch.randn(rows, depth) for _ in range(args.count)]
    x = torch.randn(1, depth)
    outs = [torch.empty(1, rows) for _ in weights]
    split_outs = [torch.empty(parts, rows // parts, 1) for _ in weights]
    transposed = [w.t() for w in weights]
    blocks = [w.view(parts, rows // parts, depth) for w in weights]
    columns = x.t().unsqueeze(0).expand(parts, depth, 1)
    mm, bmm = torch.ops.aten.mm.out, torch.ops.aten.bmm.out

    def unsplit() -> None:
        for w, out in zip(transposed, outs, strict=True):
            mm(x, w, out=out)

    def split() -> None:
        for w, out in zip(blocks, split_outs, strict=True):
            bmm(w, columns, out=out)

    return {"mm": unsplit, "split": split}


def reduction_blocks(rows: int, depth: int, args: argparse.Namespace) -> Blocks:
    """``args.count`` products of ``args.rows`` rows by weights of ``rows x depth``, eager and on
    static kernels with and without the multiply-and-sum."""
    weights = [torch.randn(rows, depth) for _ in range(args.count)]
    x = torch.randn(args.rows, depth)

    def products(x: torch.Tensor) -> list[torch.Tensor]:
        return [torch.nn.functional.linear(x, w) for w in weights]

    blocks: Blocks = {"eager": lambda: products(x)}
    for name, most_rows in (("kernels, no reduction", 0), ("kernels, reduction", args.rows)):
        rule = {"REDUCTION_MAX_ROWS": most_rows, "REDUCTION_LARGE_WEIGHT_ELEMENTS": float("inf")}
        step = own_code(products, f"{name} {rows} {depth}")
        compiled = torch.compile(
            step, backend="npugraph_ex", dynamic=False, options=FRESH_STATIC_KERNELS
        )
        with attributes_set(cpu_platform, rule):
            compiled(x)  # compiled under this rule
        blocks[name] = lambda compiled=compiled: compiled(x)
    return blocks


def run_shape(rows: int, depth: int, args: argparse.Namespace) -> dict[str, Any]:
    fns = (reduction_blocks if args.reduction else product_blocks)(rows, depth, args)
    evict = cache_evictor(args.evict_mb)

    def block(fn: Callable[[], Any]) -> float:
        evict()
        return time_calls(fn, 1)

    blocks = {name: (lambda fn=fn: block(fn)) for name, fn in fns.items()}
    times = interleaved(blocks, args.repeats, warmup=2)
    return {
        "shape": [rows, depth],
        "elements": rows * depth,
        "per_product_us": {
            name: round(median(ts) / args.count * 1e6, 2) for name, ts in times.items()
        },
        "per_repeat_ms": {name: scaled(ts, 1e3) for name, ts in times.items()},
        "spread": {name: round(spread(ts), 3) for name, ts in times.items()},
    }


REDUCTION_RULES = {
    "kernels, no reduction": {"REDUCTION_MAX_ROWS": 0},
    "kernels, reduced up to 8 rows": {"REDUCTION_LARGE_WEIGHT_ELEMENTS": float("inf")},
    "kernels, platform's rule": {},
}
"""``--decode --reduction``: the CPU platform's settings each variant compiles under."""


def decode_variants(args: argparse.Namespace) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each compiled variant of ``--decode``: the CPU platform's settings and the options it
    compiles with."""
    if args.reduction:
        kernels = {name: (rule, FRESH_STATIC_KERNELS) for name, rule in REDUCTION_RULES.items()}
        return {"ATen replay": ({}, {"static_kernel_compile": False}), **kernels}
    return {
        ("split none" if t is None else f"split >= {t}"): (
            {"SPLIT_MIN_WEIGHT_ELEMENTS": float("inf") if t is None else t},
            {},
        )
        for t in args.thresholds
    }


def decode_steps(args: argparse.Namespace) -> dict[str, Any]:
    """The decode step in eager mode and compiled under each variant, timed interleaved."""
    bench = build(args.decode, max_cache_len=128, seed=0, family=args.family, dtype=args.dtype)
    batch = args.batch
    blocks = {"eager": step_block(bench.step, bench.new_cache(batch), args.steps, batch)}
    ids, position = torch.ones(batch, 1, dtype=torch.long), torch.tensor([0])
    for name, (settings, options) in decode_variants(args).items():
        step = own_code(bench.step, name)
        compiled = torch.compile(step, backend="npugraph_ex", fullgraph=True, options=options)
        cache = bench.new_cache(batch)
        with attributes_set(cpu_platform, settings):
            compiled(ids, position, cache)  # compiled under these settings
        blocks[name] = step_block(compiled, cache, args.steps, batch)
    times = interleaved(blocks, args.repeats, warmup=2)
    eager = median(times["eager"])
    return {
        "preset": args.decode,
        "family": args.family,
        "dtype": args.dtype,
        "batch": batch,
        "median_ms": {name: round(median(ts) * 1e3, 4) for name, ts in times.items()},
        "speed_up": {name: round(eager / median(ts), 3) for name, ts in times.items()},
        "per_repeat_ms": {name: scaled(ts, 1e3) for name, ts in times.items()},
        "spread": {name: round(spread(ts), 3) for name, ts in times.items()},
    }


def report_steps(result: dict[str, Any], args: argparse.Namespace) -> None:
    print_heading(
        f"{args.family} {args.decode} decode step, {args.dtype}, batch {args.batch}, "
        f"{args.steps} steps per block; median of {args.repeats} interleaved repeats"
    )
    rows = [
        [name, ms, f"{result['speed_up'][name]:.2f}x", f"{result['spread'][name]:.0%}"]
        for name, ms in result["median_ms"].items()
    ]
    print(format_table(["variant", "ms per step", "speed-up", "spread"], rows))


def weight_shape(text: str) -> tuple[int, int]:
    rows, depth = text.split("x")
    return int(rows), int(depth)


def threshold(text: str) -> int | None:
    return None if text == "none" else int(text)


def cache_evictor(megabytes: int) -> Callable[[], None]:
    """A call that streams ``megabytes`` through the CPU caches (nothing for 0)."""
    if megabytes <= 0:
        return lambda: None
    source = torch.ones(megabytes * 2**20 // 4)
    target = torch.empty_like(source)

    def evict() -> None:
        target.copy_(source)

    return evict


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print_heading(
        f"{args.count} weights per shape, {args.rows if args.reduction else 1} row(s) each, "
        f"{torch.get_num_threads()} threads, "
        f"{args.evict_mb} MB copied before each block; median of {args.repeats} interleaved repeats"
    )
    base, *forms = results[0]["per_product_us"]
    rows = []
    for r in results:
        us = r["per_product_us"]
        n, k = r["shape"]
        ratios = [f"{us[base] / us[form]:.2f}x" for form in forms]
        rows.append([f"{n} x {k}", r["elements"], us[base], *(us[f] for f in forms), *ratios])
    header = ["weight", "elements", *(f"{f} us" for f in (base, *forms))]
    print(format_table(header + [f"{base} / {f}" for f in forms], rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--count", type=int, default=29, help="weights per shape")
    parser.add_argument(
        "--evict-mb", type=int, default=64, help="MB copied before each timed block (0: none)"
    )
    parser.add_argument(
        "--reduction", action="store_true", help="time the static kernels' multiply-and-sum"
    )
    parser.add_argument("--rows", type=int, default=1, help="--reduction: rows of each product")
    parser.add_argument(
        "--shapes", type=weight_shape, nargs="+", default=list(SHAPES), help="weights, as NxK"
    )
    parser.add_argument(
        "--decode", choices=list(QWEN3_MODELS), help="time this model's decode step instead"
    )
    parser.add_argument("--family", choices=list(FAMILIES), default="qwen3")
    parser.add_argument(
        "--thresholds",
        type=threshold,
        nargs="+",
        default=[0, 32 * 1024, 64 * 1024, None],
        help="--decode: smallest weights split, in elements (none: split nothing)",
    )
    parser.add_argument("--steps", type=int, default=64, help="--decode: steps per timed block")
    parser.add_argument("--batch", type=int, default=1, help="--decode: sequences per step")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="--decode"
    )
    add_common_args(parser, NAME, repeats=40)
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    if torch.get_num_threads() < 2:
        parser.error("the split needs at least two intra-op threads")
    if args.decode is not None:
        with torch.no_grad():
            result = decode_steps(args)
        report_steps(result, args)
        write_json(args.out, NAME, settings_of(args), result)
        return
    shapes = [s for s in args.shapes if s[0] % torch.get_num_threads() == 0]
    with torch.no_grad():
        results = [run_shape(rows, depth, args) for rows, depth in shapes]
    report(results, args)
    write_json(args.out, NAME, settings_of(args), results)


if __name__ == "__main__":
    main()
