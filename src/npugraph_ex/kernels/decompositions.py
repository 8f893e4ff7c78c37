"""Decompositions applied before Inductor lowers a key's graph (``static_kernel_compile``).

Inductor's own table, plus one rule for CPU: a one-row matrix product (the batch-1 linear layers
of a decode step) becomes a multiply-and-sum that Inductor generates as one vectorised reduction
over the weight's contiguous rows:

    before: mm(x, permute(w))                       # x: [1, K], w: [N, K]
    after:  sum(view(x, [K, 1]) * permute(w), 0)    # [1, N], read once row by row

ATen's CPU ``mm`` packs its operands for a general matrix product and, for one row, reads the
weight at a fraction of the speed a plain reduction does (``benchmarks/decode_floor.py``). Inductor
leaves one-row products to ATen on CPU because its generated kernels would be dynamic-shaped
there; here every size is a constant.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def row_times_matrix(x: torch.Tensor, w: torch.Tensor) -> Any:
    """``x @ w`` for ``x`` of one row on CPU as a reduction; NotImplemented otherwise."""
    if x.device.type != "cpu" or x.dim() != 2 or x.shape[0] != 1 or w.shape[1] == 1:
        return NotImplemented
    # Half-precision products would round before the sum; ATen's kernels accumulate in fp32.
    if x.dtype != w.dtype or x.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    return torch.sum(x.reshape(-1, 1) * w, dim=0, keepdim=True)


def row_times_matrix_plus(
    bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> Any:
    """``addmm`` with ``x`` of one row on CPU, as ``row_times_matrix`` plus the bias."""
    product = row_times_matrix(x, w)
    if product is NotImplemented:
        return NotImplemented
    if alpha != 1:
        product = alpha * product
    return product + (bias if beta == 1 else beta * bias)


def static_kernel_decompositions() -> dict[Any, Any]:
    """Inductor's decomposition table with the one-row matrix products of CPU graphs added."""
    from torch._inductor.decomposition import select_decomp_table

    return {
        **select_decomp_table(),
        aten.mm.default: row_times_matrix,
        aten.addmm.default: row_times_matrix_plus,
    }
