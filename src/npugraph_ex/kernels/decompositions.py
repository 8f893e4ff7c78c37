"""Decompositions applied before Inductor lowers a key's graph (``static_kernel_compile``).

Inductor's own table, plus one rule for CPU: a matrix product of a few rows (the linear layers of
a decode step with a batch of up to ``MAX_ROWS``) becomes a multiply-and-sum, which Inductor
generates as one vectorised reduction over the weight's contiguous rows:

    before: mm(x, permute(w))                                   # x: [M, K], w: [N, K]
    after:  sum(unsqueeze(x, 2) * unsqueeze(permute(w), 0), 1)  # [M, N]

ATen's CPU ``mm`` reads the weight of a one-row product at a fraction of the speed a plain
reduction does (``benchmarks/decode_floor.py``). ``benchmarks/few_row_products.py`` measures the
reduction against ATen's and Inductor's ``mm`` by row count: on the reference machine the
reduction is 3.8x faster than ATen's ``mm`` at one row, 2.4x at 8, 1.4x at 20 and even at 36, so
the rule stops at 8, well inside the range where it wins. Where ATen's ``mm`` already reads the
weight at about the speed of a plain reduction, the rule buys nothing: it applies on hosts where
a measurement says it pays (``host_probes.reduction_pays``, once per process).
Inductor itself decomposes only dot products (one row times one column) on CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from npugraph_ex.host_probes import reduction_pays

aten = torch.ops.aten

MAX_ROWS = 8
"""Most rows a product may have to become a reduction."""


def few_rows_times_matrix(x: torch.Tensor, w: torch.Tensor) -> Any:
    """``x @ w`` for ``x`` of at most ``MAX_ROWS`` rows on CPU as a reduction; else
    NotImplemented (Inductor's own decomposition or ATen's ``mm`` then applies)."""
    if x.device.type != "cpu" or x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        return NotImplemented
    if w.shape[1] == 1:
        return NotImplemented
    # Half-precision products would round before the sum; ATen's kernels accumulate in fp32.
    if x.dtype != w.dtype or x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    return torch.sum(x.unsqueeze(2) * w.unsqueeze(0), dim=1)


def few_rows_times_matrix_plus(
    bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> Any:
    """``addmm`` with ``x`` of few rows on CPU, as ``few_rows_times_matrix`` plus the bias."""
    product = few_rows_times_matrix(x, w)
    if product is NotImplemented:
        return NotImplemented
    if alpha != 1:
        product = alpha * product
    return product + (bias if beta == 1 else beta * bias)


def static_kernel_decompositions(device_type: str = "cpu") -> dict[Any, Any]:
    """Inductor's decomposition table, with the few-row matrix products of CPU graphs added on
    a host where a measurement says the reduction pays (``host_probes.reduction_pays``)."""
    from torch._inductor.decomposition import select_decomp_table

    table = select_decomp_table()
    if device_type != "cpu" or not reduction_pays():
        return table
    return {
        **table,
        aten.mm.default: few_rows_times_matrix,
        aten.addmm.default: few_rows_times_matrix_plus,
    }
