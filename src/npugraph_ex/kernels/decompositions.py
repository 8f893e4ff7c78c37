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

The other products by a linear layer's weight go through oneDNN's linear kernel where the
default path's pattern would take them (``passes/patterns/onednn_linear.py``: its rows, weight
size and host probe); Inductor calls it as an extern kernel (``static_compile``).
"""

from __future__ import annotations

from typing import Any

import torch

from npugraph_ex.host_probes import reduction_pays
from npugraph_ex.passes.patterns import onednn_linear

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


def times_weight_through_onednn(x: torch.Tensor, w: torch.Tensor) -> Any:
    """``x @ w`` where ``w`` is a linear layer's weight transposed, through oneDNN's linear
    where ``onednn_linear`` takes it (its rows, weight size and host probe); else
    NotImplemented."""
    weight = w.t()
    if not onednn_linear.takes(x, weight):
        return NotImplemented
    return onednn_linear.linear(x, weight, None)


def times_weight_plus_through_onednn(
    bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> Any:
    """``addmm`` of a bias per weight row, as ``times_weight_through_onednn`` with the bias."""
    weight = w.t()
    if beta != 1 or alpha != 1 or not onednn_linear.takes(x, weight, bias):
        return NotImplemented
    return onednn_linear.linear(x, weight, bias)


def first_of(*rules: Any) -> Any:
    """A decomposition that tries ``rules`` in order (NotImplemented where none applies)."""

    def decompose(*args: Any, **kwargs: Any) -> Any:
        for rule in rules:
            result = rule(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return NotImplemented

    return decompose


def static_kernel_decompositions(device_type: str = "cpu") -> dict[Any, Any]:
    """Inductor's decomposition table, with the matrix products of CPU graphs added: few rows
    as reductions on a host where a measurement says they pay (``host_probes.reduction_pays``),
    other products by a weight through oneDNN where ``onednn_linear`` takes them."""
    from torch._inductor.decomposition import select_decomp_table

    table = select_decomp_table()
    if device_type != "cpu":
        return table
    products = [times_weight_through_onednn]
    products_plus = [times_weight_plus_through_onednn]
    if reduction_pays():
        products.insert(0, few_rows_times_matrix)
        products_plus.insert(0, few_rows_times_matrix_plus)
    return {
        **table,
        aten.mm.default: first_of(*products),
        aten.addmm.default: first_of(*products_plus),
    }
