"""How fast is a decode step's grouped-query attention in each of the forms a graph can run it?

One query position (or each of ``--query-rows``: a few tokens verified at once), ``--heads``
query heads on ``--key-heads`` key heads (Qwen3-0.6B's 16 on 8, head size 128), the query laid out
as models lay it out (``[batch, positions, heads, dim]`` transposed), a mask of one row per
position shared by every head, timed three ways in one interleaved loop per dtype, batch, cached
length and positions:

- grouped: ``scaled_dot_product_attention(..., enable_gqa=True)``, what the grouped-query pattern
  made of every attention before (``npugraph_ex/passes/patterns/gqa_attention.py``);
- rows: the heads that share a key head as that head's query rows, a plain attention over the
  key heads (what the pattern makes of a few query positions now, and what transformers runs for
  one token outside ``torch.compile``), the mask repeated for each head of a group;
- repeated: the key and value heads copied for every query head first (``repeat_kv``, what the
  graph holds before the pattern).

Each output is read back as models read it, ``transpose(1, 2).contiguous()``: free where the
kernel laid the output out like the query (grouped, repeated), one copy for the rows form.

    python benchmarks/one_token_attention.py
    python benchmarks/one_token_attention.py --query-rows 1 2 4 8 16 32 --batches 1 --lengths 1024

``--decode PRESET``: a step of that Qwen3 over a ``DynamicCache`` of ``--lengths`` positions and
no padding, for each of ``--query-rows`` new tokens (one: a decode step, where transformers' sdpa
attention passes ``enable_gqa=True`` itself, no mask; more: tokens verified at once, with a causal
mask and the heads repeated); timed eagerly and as the ATen replay with the grouped-query
pattern's rows form and without it (the CPU platform answering that no position runs as rows:
every grouped attention as ``enable_gqa``).

    python benchmarks/one_token_attention.py --decode qwen3-0.6b --dtypes bfloat16
    python benchmarks/one_token_attention.py --decode qwen3-0.6b --query-rows 4 --batches 1 8
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
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
    time_calls,
    write_json,
)
from qwen3_decode_step import build
from transformers import DynamicCache

from npugraph_ex.bench.decode import cache_keyword
from npugraph_ex.bench.variants import own_code
from npugraph_ex.passes.patterns.gqa_attention import grouped_rows_attention
from npugraph_ex.runtime.platform import platform_for

NAME = "one_token_attention"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def forms(
    dtype: torch.dtype, batch: int, length: int, positions: int, args: argparse.Namespace
) -> dict[str, Callable[[], Any]]:
    heads, groups, dim = args.heads, args.key_heads, args.dim
    q = torch.randn(batch, positions, heads, dim, dtype=dtype).transpose(1, 2)
    k, v = (torch.randn(batch, groups, length, dim, dtype=dtype) for _ in range(2))
    mask = torch.randn(batch, 1, positions, length, dtype=dtype)
    per_group = heads // groups

    def grouped() -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def rows() -> Any:
        return grouped_rows_attention(q, k, v, mask, None)

    def repeated() -> Any:
        k_all, v_all = (t.repeat_interleave(per_group, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)

    def read_as_models_do(form: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: form().transpose(1, 2).contiguous()

    return {
        name: read_as_models_do(form)
        for name, form in (("grouped", grouped), ("rows", rows), ("repeated", repeated))
    }


def run(
    dtype: str, batch: int, length: int, positions: int, args: argparse.Namespace
) -> dict[str, Any]:
    fns = forms(DTYPES[dtype], batch, length, positions, args)
    reference = fns["grouped"]()
    diff = max(float((fns[f]() - reference).abs().max()) for f in ("rows", "repeated"))
    blocks = {name: (lambda fn=fn: time_calls(fn, args.calls)) for name, fn in fns.items()}
    times = interleaved(blocks, args.repeats, warmup=1)
    return {
        "dtype": dtype,
        "batch": batch,
        "length": length,
        "positions": positions,
        "median_us": {name: round(median(ts) * 1e6, 2) for name, ts in times.items()},
        "per_repeat_us": {name: scaled(ts, 1e6) for name, ts in times.items()},
        "max_abs_diff": diff,
    }


NO_ROWS_FORM = {"grouped_rows_max_positions": lambda platform: 0}
"""The CPU platform's answer set to no position: every grouped attention as ``enable_gqa``."""


def decode_forms(
    dtype: str, batch: int, length: int, positions: int, args: argparse.Namespace
) -> dict[str, Callable[[], Any]]:
    """One step of ``positions`` tokens of ``args.decode`` over a fresh ``DynamicCache`` of
    ``length`` positions per call: eagerly, and replayed with the shared heads as rows and as
    ``enable_gqa``."""
    bench = build(args.decode, max_cache_len=length + 1, seed=0, dtype=dtype)
    model, config = bench.model, bench.config
    shape = (batch, config.num_key_value_heads, length, config.head_dim)
    layers = range(config.num_hidden_layers)
    keys, values = ([torch.randn(shape, dtype=model.dtype) for _ in layers] for _ in range(2))
    ids, keyword = torch.ones(batch, positions, dtype=torch.long), cache_keyword(model)

    def step(ids: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:
        cache = DynamicCache(config=config)
        for layer, (key, value) in enumerate(zip(keys, values, strict=True)):
            cache.update(key, value, layer)
        return model(ids, use_cache=True, **{keyword: cache}).logits

    forms: dict[str, Callable[[], Any]] = {"eager": lambda: step(ids, keys, values)}
    for name, settings in (("replay, enable_gqa", NO_ROWS_FORM), ("replay, rows", {})):
        compiled = torch.compile(
            own_code(step, name),
            backend="npugraph_ex",
            fullgraph=True,
            dynamic=False,
            options={"static_kernel_compile": False},
        )
        with attributes_set(type(platform_for("cpu")), settings):
            compiled(ids, keys, values)  # compiled and captured in this form
        forms[name] = lambda compiled=compiled: compiled(ids, keys, values)
    return forms


def run_decode(
    dtype: str, batch: int, length: int, positions: int, args: argparse.Namespace
) -> dict[str, Any]:
    fns = decode_forms(dtype, batch, length, positions, args)
    reference = fns["eager"]().float()
    diff = max(float((fns[f]().float() - reference).abs().max()) for f in fns)
    blocks = {name: (lambda fn=fn: time_calls(fn, args.calls)) for name, fn in fns.items()}
    times = interleaved(blocks, args.repeats, warmup=1)
    del fns, blocks, reference  # the model, its compiled forms and their captures: gone
    torch._dynamo.reset()
    gc.collect()
    eager = median(times["eager"])
    return {
        "dtype": dtype,
        "batch": batch,
        "length": length,
        "positions": positions,
        "median_ms": {name: round(median(ts) * 1e3, 3) for name, ts in times.items()},
        "speed_up": {name: round(eager / median(ts), 3) for name, ts in times.items()},
        "per_repeat_ms": {name: scaled(ts, 1e3) for name, ts in times.items()},
        "max_abs_diff_logits": diff,
    }


def report_decode(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print_heading(
        f"{args.decode} step over a DynamicCache (no mask at one position), ms per step; median of "
        f"{args.repeats} interleaved repeats of {args.calls} calls"
    )
    rows = [
        [r["dtype"], r["batch"], r["length"], r["positions"]]
        + [f"{ms} ({r['speed_up'][name]:.2f}x)" for name, ms in r["median_ms"].items()]
        + [f"{r['max_abs_diff_logits']:.2g}"]
        for r in results
    ]
    names = list(results[0]["median_ms"]) if results else []
    headers = ["dtype", "batch", "length", "positions", *names, "max |diff| logits"]
    print(format_table(headers, rows))


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print_heading(
        f"{args.heads} heads on {args.key_heads} key heads of {args.dim}; "
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
                r["positions"],
                us["grouped"],
                us["rows"],
                us["repeated"],
                f"{us['grouped'] / us['rows']:.2f}x",
                f"{r['max_abs_diff']:.2g}",
            ]
        )
    headers = ["dtype", "batch", "length", "positions", "grouped us", "rows us", "repeated us"]
    print(format_table([*headers, "grouped / rows", "max |diff|"], rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(DTYPES), default=["float32", "bfloat16"]
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 1024])
    parser.add_argument(
        "--query-rows", type=int, nargs="+", default=[1], help="query positions per call"
    )
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--key-heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=20, help="calls per timed block")
    parser.add_argument(
        "--decode", choices=list(QWEN3_MODELS), help="time this model's decode step instead"
    )
    add_common_args(parser, NAME, repeats=15)
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    shapes = [
        (dtype, batch, length)
        for dtype in args.dtypes
        for batch in args.batches
        for length in args.lengths
    ]
    with torch.no_grad():
        measure, show = (run_decode, report_decode) if args.decode else (run, report)
        results = [measure(*shape, rows, args) for shape in shapes for rows in args.query_rows]
        show(results, args)
    write_json(args.out, NAME, settings_of(args), results)


if __name__ == "__main__":
    main()
