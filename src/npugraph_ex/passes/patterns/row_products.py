"""A few-row matrix product on CPU as a batched product, split over the intra-op threads.

A decode step multiplies one row (one per sequence of the batch) by every weight matrix. ATen
runs that ``mm`` as one matrix-vector (or skinny matrix) product on one thread (MKL; on the
reference AMD CPU in its generic, unvectorised path). Split the weight's rows into as many
blocks as there are threads and the same product becomes a ``bmm``, which ATen runs one block
per thread through MKL's batched path:

    before: %y = aten.mm(%x, aten.t(%w))                  x: [M, K], w: [N, K], M <= 8
    after:  %y = aten.bmm(%w.view(P, N/P, K), %x.t().expand(P, K, M)).view(N, M).t()
            (and a copy into the row-major layout ``mm`` gives, where M > 1)

An ``nn.Linear`` with a bias (``addmm``; Qwen2's q, k and v projections, most encoders) splits
the same way, its bias added inside the batched product, as ``addmm`` adds it inside its own:

    before: %y = aten.addmm(%b, %x, aten.t(%w))           b: [N]
    after:  %y = aten.baddbmm(%b.view(P, N/P, 1), %w.view(P, N/P, K), %x.t().expand(P, K, M))
            (then the same reshape as above)

On the tiny Qwen3 decode step this makes the replay 2x to 3x faster than eager instead of about
1.25x (``docs/notes/the-demo-on-cpu-earlier-runs.md``; measured with 2 threads, the only count
tried). Applied where the row count is a constant, the weight is contiguous and its rows divide
into at least two blocks, and the platform of the tensors' device says the split pays
(``Platform.split_pays``; the CPU answers in ``runtime/cpu/platform.py``: float32, few rows, a
weight large enough, on a host where a measurement says so); the block count is fixed when the
graph is compiled. Where the
row count is symbolic (``dynamic=True``), each captured key whose sizes give few enough rows gets
the same split at capture (``split_of``, ``capture/key_shapes.py``). Not applied with
``static_kernel_compile``, whose own decomposition of few-row products into reductions is faster
still.

Tolerance: each output is the same dot product summed by another kernel, which may order the
additions differently (max |diff| 5.7e-7 to 7.8e-7 on the tiny Qwen3's logits; 4.8e-7 on the
products with a bias, unit-scale values).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from npugraph_ex.passes.graph_facts import core_cap_at
from npugraph_ex.passes.patterns.checks import bound, bound_tensors, one_bias_per_row, one_kind
from npugraph_ex.passes.patterns.registry import add_replacement
from npugraph_ex.runtime.platform import Product, platform_for


def parts_for(rows: int) -> int:
    """Blocks to split ``rows`` weight rows into: as many as the intra-op threads, or fewer so
    that they divide evenly (1: do not split)."""
    return math.gcd(rows, torch.get_num_threads())


def search(x, w):  # noqa: ANN001, ANN201
    return torch.mm(x, w.t())


def replace(x, w):  # noqa: ANN001, ANN201
    weight_blocks, columns = split_operands(x, w)
    return row_major(torch.bmm(weight_blocks, columns), x, w)


def search_with_bias(b, x, w):  # noqa: ANN001, ANN201
    return torch.addmm(b, x, w.t())


def replace_with_bias(b, x, w):  # noqa: ANN001, ANN201
    weight_blocks, columns = split_operands(x, w)
    parts, block_rows, _ = weight_blocks.shape
    bias_blocks = b.reshape(parts, block_rows, 1)
    return row_major(torch.baddbmm(bias_blocks, weight_blocks, columns), x, w)


def split_operands(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight as ``P`` blocks of rows, and the input's columns repeated for every block."""
    rows, depth = w.shape
    parts = parts_for(rows)
    columns = x.t().unsqueeze(0).expand(parts, depth, x.shape[0])
    return w.reshape(parts, rows // parts, depth), columns


def row_major(product: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The blocks' ``[P, N/P, M]`` results as the ``[M, N]`` row-major matrix ``mm`` returns."""
    rows, count = w.shape[0], x.shape[0]
    if count == 1:
        return product.reshape(1, rows)
    # A clone, not ``.contiguous()``: traced, both are a clone; run under a dispatch mode
    # (``capture/key_shapes``), ``contiguous`` arrives undecomposed and has no ``out=`` form.
    return product.reshape(rows, count).t().clone(memory_format=torch.contiguous_format)


def splittable(match: Any) -> bool:
    """A product ``splits`` takes, outside any ``limit_core_num`` block that allows fewer cores
    than there are threads (the blocks would outnumber the threads it runs on)."""
    cap = core_cap_at(match.nodes[0])
    if cap is not None and cap < torch.get_num_threads():
        return False
    tensors = bound_tensors(match, "x", "w")
    return tensors is not None and splits(*tensors)


def splits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """A product of both operands of one dtype and device, a constant row count (not a symbolic
    size) and a contiguous weight of constant size, where the platform of their device says the
    split into ``parts_for`` blocks pays (``Platform.split_pays``)."""
    count, (rows, depth) = x.shape[0], w.shape
    if not (
        one_kind([x, w], None)
        and isinstance(count, int)
        and isinstance(rows, int)
        and isinstance(depth, int)
        and w.is_contiguous()
    ):
        return False
    product = Product(count, rows, depth, x.dtype)
    return platform_for(x.device.type).split_pays(product, parts_for(rows))


def splittable_with_bias(match: Any) -> bool:
    """``splittable``, with a bias of one float32 value per weight row (``one_bias_per_row``)."""
    return splittable(match) and one_bias_per_row(bound(match, "b"), bound(match, "w"))


def split_of(op: Any, args: tuple) -> Callable[[], torch.Tensor] | None:
    """The split of one ``mm(x, w.t())`` or ``addmm(b, x, w.t())`` call with these (real)
    arguments, to run instead of it, or None where the pattern would leave it alone: what
    ``capture/key_shapes`` applies to a key of a graph whose row counts were symbolic."""
    with_bias = op is torch.ops.aten.addmm.default
    if len(args) != (3 if with_bias else 2):
        return None
    bias, (x, w_t) = (args[0], args[1:]) if with_bias else (None, args)
    if not (isinstance(x, torch.Tensor) and isinstance(w_t, torch.Tensor) and w_t.dim() == 2):
        return None
    w = w_t.t()
    if x.dim() != 2 or not splits(x, w):
        return None
    if bias is None:
        return lambda: replace(x, w)
    if not one_bias_per_row(bias, w):
        return None
    return lambda: replace_with_bias(bias, x, w)


def register(pass_dict: Any) -> None:
    register_linear_forms(
        pass_dict, (replace, splittable), (replace_with_bias, splittable_with_bias), rows=1
    )


def register_linear_forms(
    pass_dict: Any,
    without_bias: tuple[Callable[..., Any], Callable[[Any], bool]],
    with_bias: tuple[Callable[..., Any], Callable[[Any], bool]],
    rows: int,
) -> None:
    """Replace a linear layer's product (``search``, ``search_with_bias``) by each form's
    replacement where its check takes the match (example inputs of ``rows`` rows)."""
    x, w, b = torch.randn(rows, 8), torch.randn(4, 8), torch.randn(4)
    for search_fn, (replace_fn, check), inputs in (
        (search, without_bias, [x, w]),
        (search_with_bias, with_bias, [b, x, w]),
    ):
        add_replacement(pass_dict, search_fn, replace_fn, inputs, check)
