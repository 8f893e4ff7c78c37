"""How fast is a decode step's grouped-query attention in each of the forms a graph can run it?

One query position, ``--heads`` query heads on ``--key-heads`` key heads (Qwen3-0.6B's 16 on 8,
head size 128), a mask of one row shared by every head, timed three ways in one interleaved loop
per dtype, batch and cached length:

- grouped: ``scaled_dot_product_attention(..., enable_gqa=True)``, what the grouped-query pattern
  made of every attention before (``npugraph_ex/passes/patterns/gqa_attention.py``);
- rows: the heads that share a key head as that head's query rows, a plain attention over the
  key heads (what the pattern makes of one query position now, and what transformers runs for
  one token outside ``torch.compile``);
- repeated: the key and value heads copied for every query head first (``repeat_kv``, what the
  graph holds before the pattern).

    python benchmarks/one_token_attention.py
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from common import (
    add_common_args,
    apply_threads,
    environment,
    environment_line,
    format_table,
    interleaved,
    median,
    scaled,
    settings_of,
    time_calls,
    write_json,
)

from npugraph_ex.passes.patterns.gqa_attention import grouped_rows_attention

NAME = "one_token_attention"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def forms(
    dtype: torch.dtype, batch: int, length: int, args: argparse.Namespace
) -> dict[str, Callable[[], Any]]:
    heads, groups, dim = args.heads, args.key_heads, args.dim
    q = torch.randn(batch, heads, 1, dim, dtype=dtype)
    k, v = (torch.randn(batch, groups, length, dim, dtype=dtype) for _ in range(2))
    mask = torch.zeros(batch, 1, 1, length, dtype=dtype)
    per_group = heads // groups

    def grouped() -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def rows() -> Any:
        return grouped_rows_attention(q, k, v, mask, None)

    def repeated() -> Any:
        k_all, v_all = (t.repeat_interleave(per_group, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)

    return {"grouped": grouped, "rows": rows, "repeated": repeated}


def run(dtype: str, batch: int, length: int, args: argparse.Namespace) -> dict[str, Any]:
    fns = forms(DTYPES[dtype], batch, length, args)
    reference = fns["grouped"]()
    diff = max(float((fns[f]() - reference).abs().max()) for f in ("rows", "repeated"))
    blocks = {name: (lambda fn=fn: time_calls(fn, args.calls)) for name, fn in fns.items()}
    times = interleaved(blocks, args.repeats, warmup=1)
    return {
        "dtype": dtype,
        "batch": batch,
        "length": length,
        "median_us": {name: round(median(ts) * 1e6, 2) for name, ts in times.items()},
        "per_repeat_us": {name: scaled(ts, 1e6) for name, ts in times.items()},
        "max_abs_diff": diff,
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print()
    print(environment_line(environment()))
    print(
        f"{args.heads} heads on {args.key_heads} key heads of {args.dim}, one query position; "
        f"median of {args.repeats} interleaved repeats of {args.calls} calls"
    )
    rows = []
    for r in results:
        us = r["median_us"]
        rows.append(
            [
                r["dtype"],
                r["batch"],
                r["length"],
                us["grouped"],
                us["rows"],
                us["repeated"],
                f"{us['grouped'] / us['rows']:.2f}x",
                f"{r['max_abs_diff']:.2g}",
            ]
        )
    headers = ["dtype", "batch", "length", "grouped us", "rows us", "repeated us"]
    print(format_table([*headers, "grouped / rows", "max |diff|"], rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(DTYPES), default=["float32", "bfloat16"]
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--key-heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=20, help="calls per timed block")
    add_common_args(parser, NAME, repeats=15)
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    with torch.no_grad():
        results = [
            run(dtype, batch, length, args)
            for dtype in args.dtypes
            for batch in args.batches
            for length in args.lengths
        ]
    report(results, args)
    write_json(args.out, NAME, settings_of(args), results)


if __name__ == "__main__":
    main()
