"""A few-row matrix product on CPU as a batched product, split over the intra-op threads.

A decode step multiplies one row (one per sequence of the batch) by every weight matrix. ATen
runs that ``mm`` as one matrix-vector (or skinny matrix) product on one thread (MKL; on the
reference AMD CPU in its generic, unvectorised path). Split the weight's rows into as many
blocks as there are threads and the same product becomes a ``bmm``, which ATen runs one block
per thread through MKL's batched path:

    before: %y = aten.mm(%x, aten.t(%w))                  x: [M, K], w: [N, K], M <= 8
    after:  %y = aten.bmm(%w.view(P, N/P, K), %x.t().expand(P, K, M)).view(N, M).t()
            (and a copy into the row-major layout ``mm`` gives, where M > 1)

On the tiny Qwen3 decode step this makes the replay 2x to 3x faster than eager instead of about
1.25x (``docs/benchmarks.md``; measured with 2 threads, the only count tried). Applied to
float32 CPU graphs with more than one intra-op thread, where the row count is a constant up to
``MAX_ROWS`` and the weight's rows divide evenly; the block count is fixed when the graph is
compiled. Not applied with ``static_kernel_compile``, whose own decomposition of few-row
products into reductions is faster still.

Tolerance: each output is the same dot product summed by another kernel, which may order the
additions differently (max |diff| 5.7e-7 to 7.8e-7 on the tiny Qwen3's logits).
"""

from __future__ import annotations

import math
from typing import Any

import torch

MAX_ROWS = 8
"""Most rows split: ``python benchmarks/few_row_products.py --rows 1 4 8 16 32`` times the tiny
Qwen3's 29 products split against ``mm`` at 2.67x (1 row), 2.66x (4), 1.23x (8), 0.98x (16)."""


def parts_for(rows: int) -> int:
    """Blocks to split ``rows`` weight rows into: as many as the intra-op threads, or fewer so
    that they divide evenly (1: do not split)."""
    return math.gcd(rows, torch.get_num_threads())


def search(x, w):  # noqa: ANN001, ANN201
    return torch.mm(x, w.t())


def replace(x, w):  # noqa: ANN001, ANN201
    rows, depth = w.shape
    count = x.shape[0]
    parts = parts_for(rows)
    blocks = w.reshape(parts, rows // parts, depth)
    product = torch.bmm(blocks, x.t().unsqueeze(0).expand(parts, depth, count))
    if count == 1:
        return product.reshape(1, rows)
    return product.reshape(rows, count).t().contiguous()


def splittable(match: Any) -> bool:
    """A float32 CPU product of at most ``MAX_ROWS`` rows (a constant, not a symbolic size) by a
    contiguous weight whose rows split into at least two blocks."""
    x, w = (match.kwargs[name].meta.get("val") for name in ("x", "w"))
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return False
    rows = w.shape[0]
    return (
        x.device.type == "cpu"
        and x.dtype == w.dtype == torch.float32
        and isinstance(x.shape[0], int)
        and 1 <= x.shape[0] <= MAX_ROWS
        and isinstance(rows, int)
        and w.is_contiguous()
        and parts_for(rows) > 1
    )


def register(pass_dict: Any) -> None:
    from torch._inductor import pattern_matcher

    from npugraph_ex.passes.patterns import trace_aten

    pattern_matcher.register_replacement(
        search,
        replace,
        [torch.randn(1, 8), torch.randn(4, 8)],
        trace_aten,
        pass_dict,
        extra_check=splittable,
    )
