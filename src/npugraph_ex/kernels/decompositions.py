"""Decompositions applied before Inductor lowers a key's graph (``static_kernel_compile``).

Inductor's own table, plus the forms of matrix products the platform of the graph's device lists
(``Platform.static_kernel_products``; on CPU, ``runtime/cpu/platform.py``). A matrix product of a
few rows (the linear layers of a decode step with a small batch) becomes a multiply-and-sum,
which Inductor generates as one vectorised reduction over the weight's contiguous rows:

    before: mm(x, permute(w))                                   # x: [M, K], w: [N, K]
    after:  sum(unsqueeze(x, 2) * unsqueeze(permute(w), 0), 1)  # [M, N]

ATen's CPU ``mm`` reads the weight of a one-row product at a fraction of the speed a plain
reduction does (``benchmarks/decode_floor.py``). ``benchmarks/few_row_products.py`` measures the
reduction against ATen's and Inductor's ``mm`` by row count: on the reference machine the
reduction is 3.8x faster than ATen's ``mm`` at one row, 2.4x at 8, 1.4x at 20 and even at 36, so
the rule stops at 8, well inside the range where it wins. The reduction reads the weight once
per row, the product once: a weight too large for the caches is reduced at 2 rows at most
(``REDUCTION_LARGE_WEIGHT_ELEMENTS``). Where ATen's ``mm`` already reads the
weight at about the speed of a plain reduction, the rule buys nothing: it applies on hosts where
a measurement says it pays (``runtime/cpu/probes.py``, once per process).
Inductor itself decomposes only dot products (one row times one column) on CPU.

The other products by a linear layer's weight go through oneDNN's linear kernel where the
default path's pattern would take them (``passes/patterns/onednn_linear.py``, which asks the
platform); Inductor calls it as an extern kernel (``static_compile``).

A key's graph was traced with ATen's layouts, and its views were chosen by them; the re-trace must
give every value the layout the graph expects. Inductor's ``cat`` copies the one input a ``cat``
keeps once its empty ones are dropped (a cache's first ``cat`` onto ``torch.tensor([])``) in that
input's layout, where ATen's ``cat`` lays it out as ``contiguous_format`` (unless every input
suggests another): a transposed key then met a ``view`` it cannot take, and the key stayed on ATen.
``cat_laid_out_as_aten`` gives Inductor's result ATen's layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npugraph_ex.passes.patterns import onednn_linear
from npugraph_ex.runtime.platform import ONEDNN_LINEAR, REDUCTION, Product, platform_for

aten = torch.ops.aten


def few_rows_times_matrix(x: torch.Tensor, w: torch.Tensor) -> Any:
    """``x @ w`` as a reduction, for a 2-d ``x`` and a ``w`` of more than one column and of
    ``x``'s dtype, where the platform of ``x``'s device says it pays
    (``Platform.reduction_pays``: on CPU, few rows, per dtype); else NotImplemented (ATen's
    ``mm`` then applies). Half precision is multiplied and summed in float32 and rounded once,
    as ATen's kernels accumulate."""
    summed = summed_in_float(x, w)
    return summed if summed is NotImplemented else summed.to(x.dtype)


def few_rows_times_matrix_plus(
    bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> Any:
    """``addmm`` as ``few_rows_times_matrix`` plus the bias (added before the one rounding)."""
    product = summed_in_float(x, w)
    if product is NotImplemented:
        return NotImplemented
    if alpha != 1:
        product = alpha * product
    bias = bias.to(product.dtype)
    return (product + (bias if beta == 1 else beta * bias)).to(x.dtype)


def summed_in_float(x: torch.Tensor, w: torch.Tensor) -> Any:
    """The reduction of ``few_rows_times_matrix`` before its rounding to ``x``'s dtype (in
    float32 for half precision, else in ``x``'s dtype), or NotImplemented."""
    if x.dim() != 2 or w.dim() != 2 or w.shape[1] == 1 or x.dtype != w.dtype:
        return NotImplemented
    product = Product(x.shape[0], w.shape[1], w.shape[0], x.dtype)
    if not platform_for(x.device.type).reduction_pays(product):
        return NotImplemented
    accumulate = torch.promote_types(x.dtype, torch.float32)
    x = computed_once(x)
    return torch.sum(x.to(accumulate).unsqueeze(2) * w.to(accumulate).unsqueeze(0), dim=1)


def computed_once(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a buffer Inductor computes before the reduction that reads it. The reduction
    reads each element of ``x`` once per output column, and Inductor would otherwise inline
    ``x``'s producer into its loop: an activation (GELU's ``erf``) computed once per column, 256
    times for a layer of 256. ``as_strided`` onto ``x``'s own layout is the identity, and
    Inductor lowers it on a stored buffer. Only for a contiguous ``x`` at the start of its
    storage (a layer's fresh activation): where its layout is that of the buffer it lies in."""
    if not x.is_contiguous() or x.storage_offset() != 0:
        return x
    return torch.as_strided(x, x.shape, x.stride())


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


PRODUCT_FORMS = {
    REDUCTION: (few_rows_times_matrix, few_rows_times_matrix_plus),
    ONEDNN_LINEAR: (times_weight_through_onednn, times_weight_plus_through_onednn),
}
"""Each form ``Platform.static_kernel_products`` may name: its rules for ``mm`` and ``addmm``."""


def cat_memory_format(tensors: Sequence[torch.Tensor]) -> torch.memory_format:
    """The layout ATen's ``cat`` gives its result: the one every input suggests, else
    ``contiguous_format`` (empty inputs count)."""
    from torch._prims_common import suggest_memory_format

    formats = {suggest_memory_format(t) for t in tensors}
    return formats.pop() if len(formats) == 1 else torch.contiguous_format


def cat_laid_out_as_aten(inductors_cat: Any) -> Any:
    """``inductors_cat``, its result laid out as ATen's ``cat`` lays it out
    (``cat_memory_format``)."""

    def cat(tensors: Sequence[torch.Tensor], dim: int = 0) -> Any:
        result = inductors_cat(tensors, dim)
        if result is NotImplemented:
            return result
        # No copy where the result is laid out so already.
        return result.contiguous(memory_format=cat_memory_format(tensors))

    return cat


def static_kernel_decompositions(device_type: str = "cpu") -> dict[Any, Any]:
    """Inductor's decomposition table, ``cat`` laid out as ATen lays it out
    (``cat_laid_out_as_aten``), with the forms of matrix products the platform of
    ``device_type`` lists, tried in its order (on CPU: few rows as reductions on a host where a
    measurement says they pay, other products by a weight through oneDNN where
    ``onednn_linear`` takes them)."""
    from torch._inductor.decomposition import select_decomp_table

    table = dict(select_decomp_table())
    if aten.cat.default in table:
        table[aten.cat.default] = cat_laid_out_as_aten(table[aten.cat.default])
    forms = [PRODUCT_FORMS[form] for form in platform_for(device_type).static_kernel_products()]
    if not forms:
        return table
    return {
        **table,
        aten.mm.default: first_of(*(products for products, _ in forms)),
        aten.addmm.default: first_of(*(products_plus for _, products_plus in forms)),
    }
