"""Up to how many rows does a multiply-and-sum beat ``mm`` for a model's matrix products?

``static_kernel_compile`` turns matrix products of up to ``REDUCTION_MAX_ROWS`` rows into
reductions on CPU (``npugraph_ex/kernels/decompositions.py``, ``runtime/cpu/platform.py``). This
measures where that pays: for each row count, every ``nn.Linear`` weight of a Qwen3 preset
multiplied by an input of that many rows, in model order, timed in one interleaved loop three
ways:

- eager mm: ATen's ``x @ w.t()``;
- inductor mm: the same products compiled by Inductor (static shapes), which hands them to ATen;
- inductor reduction: ``(x[:, :, None] * w.t()[None]).sum(1)`` compiled by Inductor, the form the
  decomposition produces;
- split bmm: the weight's rows cut into one block per intra-op thread and multiplied as one
  ``bmm`` (then copied to row-major where there is more than one row), in eager mode: what
  ``pattern_fusion_pass`` does to the default path's products of up to 8 rows
  (``npugraph_ex/passes/patterns/row_products.py``).

With ``--bias`` every product also adds a bias of one value per weight row, as an
``nn.Linear`` with a bias does: ``addmm`` in eager mode, and the split as one ``baddbmm``.

With ``--onednn`` two more variants call oneDNN's linear kernel (what Inductor's ``freezing``
uses on CPU), which the default path does not use: *onednn packed* on weights reordered once,
outside the timing, into oneDNN's blocked layout for that row count (a second copy of every
weight), and *onednn* on the weights as they are (what ``pattern_fusion_pass`` gives products of
4 rows and more where the host probe says it pays: ``passes/patterns/onednn_linear.py``).

    python benchmarks/few_row_products.py
    python benchmarks/few_row_products.py --rows 1 2 4 8 16 32 64
    python benchmarks/few_row_products.py --bias --rows 1 4 8 16
    python benchmarks/few_row_products.py --onednn --rows 1 4 8 12 16 20 28 35

``--dtype bfloat16`` (or ``float16``) runs every variant in that dtype (the weights cast as
``from_pretrained(torch_dtype=...)`` casts them).

    python benchmarks/few_row_products.py --onednn --dtype bfloat16 --rows 1 4 8 32 64
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from common import (
    QWEN3_PRESETS,
    add_common_args,
    apply_threads,
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
from qwen3_decode_step import build

from npugraph_ex.passes.patterns.row_products import replace as split_product
from npugraph_ex.passes.patterns.row_products import replace_with_bias as split_product_with_bias

NAME = "few_row_products"
VARIANTS = ("eager mm", "inductor mm", "inductor reduction", "split bmm")
ONEDNN_VARIANTS = ("onednn packed", "onednn")


def onednn_products(
    weights: list[torch.Tensor], biases: list[torch.Tensor] | None, rows: int
) -> dict[str, Callable[[list[torch.Tensor]], Any]]:
    """The products through oneDNN's linear, on packed and on plain weights."""
    linear = torch.ops.mkldnn._linear_pointwise
    pairs = list(zip(weights, biases or [None] * len(weights), strict=True))
    packed = [(torch.ops.mkldnn._reorder_linear_weight(w, rows), b) for w, b in pairs]

    def through(pairs: list[tuple[torch.Tensor, Any]]) -> Callable[[list[torch.Tensor]], Any]:
        return lambda xs: [
            linear(x, w, b, "none", [], "") for x, (w, b) in zip(xs, pairs, strict=True)
        ]

    return {"onednn packed": through(packed), "onednn": through(pairs)}


def products(
    weights: list[torch.Tensor], biases: list[torch.Tensor] | None
) -> dict[str, Callable[[list[torch.Tensor]], Any]]:
    """Each variant's products of the inputs by ``weights`` (plus ``biases``, if any)."""
    if biases is None:
        pairs = [(w, None) for w in weights]
    else:
        pairs = list(zip(weights, biases, strict=True))

    def matmuls(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            x @ w.t() if b is None else torch.addmm(b, x, w.t())
            for x, (w, b) in zip(xs, pairs, strict=True)
        ]

    def reductions(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        sums = [
            ((x.unsqueeze(2) * w.t().unsqueeze(0)).sum(1), b)
            for x, (w, b) in zip(xs, pairs, strict=True)
        ]
        return [total if b is None else total + b for total, b in sums]

    def split(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            split_product(x, w) if b is None else split_product_with_bias(b, x, w)
            for x, (w, b) in zip(xs, pairs, strict=True)
        ]

    return {
        "eager mm": matmuls,
        "inductor mm": torch.compile(matmuls, backend="inductor", dynamic=False),
        "inductor reduction": torch.compile(reductions, backend="inductor", dynamic=False),
        "split bmm": split,
    }


def run_rows(rows: int, weights: list[torch.Tensor], args: argparse.Namespace) -> dict[str, Any]:
    torch._dynamo.reset()
    dtype = weights[0].dtype
    inputs = [torch.randn(rows, w.shape[1], dtype=dtype) for w in weights]
    biases = [torch.randn(w.shape[0], dtype=dtype) for w in weights] if args.bias else None
    fns = products(weights, biases)
    if args.onednn:
        fns.update(onednn_products(weights, biases, rows))
    reference = fns["eager mm"](inputs)
    diff = max(
        float((a - b).abs().max())
        for variant in fns
        if variant not in ("eager mm", "inductor mm")
        for a, b in zip(reference, fns[variant](inputs), strict=True)
    )
    blocks = {
        name: (lambda fn=fn: time_calls(lambda: fn(inputs), args.calls)) for name, fn in fns.items()
    }
    times = interleaved(blocks, args.repeats, warmup=1)
    return {
        "rows": rows,
        "max_abs_diff": diff,
        "per_repeat_ms": {name: scaled(ts, 1e3) for name, ts in times.items()},
        "median_ms": {name: round(median(ts) * 1e3, 4) for name, ts in times.items()},
        "spread": {name: round(spread(ts), 3) for name, ts in times.items()},
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace, count: int) -> None:
    plus = ", each plus a bias (addmm; split: baddbmm)" if args.bias else ""
    print_heading(
        f"{args.preset}: {count} weight matrices in {args.dtype}{plus}; "
        f"median of {args.repeats} interleaved repeats"
    )
    variants = VARIANTS + (ONEDNN_VARIANTS if args.onednn else ())
    against = ("inductor reduction", "split bmm", *ONEDNN_VARIANTS[: 2 if args.onednn else 0])
    headers = [
        "rows",
        *(f"{v} ms" for v in variants),
        *(f"eager mm / {v}" for v in against),
        "max |diff|",
    ]
    rows = []
    for r in results:
        ms = r["median_ms"]
        ratios = [f"{ms['eager mm'] / ms[v]:.2f}x" for v in against]
        rows.append([r["rows"], *(ms[v] for v in variants), *ratios, f"{r['max_abs_diff']:.2g}"])
    print(format_table(headers, rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--preset", choices=list(QWEN3_PRESETS), default="tiny")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 20, 36, 64])
    parser.add_argument("--calls", type=int, default=20, help="calls per timed block")
    parser.add_argument(
        "--bias", action="store_true", help="add a bias per weight row to every product"
    )
    parser.add_argument(
        "--onednn", action="store_true", help="add oneDNN's linear, on packed and plain weights"
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")

    add_common_args(parser, NAME, repeats=7)
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    model = build(args.preset, max_cache_len=128, seed=0, dtype=args.dtype).model
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        results = [run_rows(rows, weights, args) for rows in args.rows]
    report(results, args, len(weights))
    write_json(args.out, NAME, settings_of(args), results)


if __name__ == "__main__":
    main()
