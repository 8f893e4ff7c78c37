"""A matrix product plus a bias in one kernel.

Code that writes ``x @ w + b`` (``nn.Linear`` already traces to ``addmm``) runs two kernels and
keeps the product in a buffer of its own:

    before: %p = aten.mm(%x, %w); %y = aten.add(%p, %b)
    after:  %y = aten.addmm(%b, %x, %w)

Applied where ``addmm`` computes what the add did: the bias is a tensor (not a number: ``a @ b +
1`` is left as is), of the product's dtype and device (the add would promote or mix devices;
``addmm`` does neither), that broadcasts into the product without growing it.

Tolerance: the bias is added inside the matrix product, which may round differently from a
separate add (max |diff| 1.2e-7 measured for unit-scale float32 values; tested within four
units in the last place for float32, float16 and bfloat16; exact for integers).
"""

from __future__ import annotations

from typing import Any

import torch

from npugraph_ex.passes.patterns.checks import bound_tensors, one_kind, output_value, same_shape
from npugraph_ex.passes.patterns.registry import add_replacement


def search(x, w, b):  # noqa: ANN001, ANN201
    return torch.mm(x, w) + b


def replace(x, w, b):  # noqa: ANN001, ANN201
    return torch.addmm(b, x, w)


def fusable(match: Any) -> bool:
    """The bias is a tensor of the product's dtype and device, at most 2-d, and the sum has the
    product's shape (the bias broadcasts into it)."""
    tensors = bound_tensors(match, "x", "w", "b")
    if tensors is None:
        return False
    x, w, b = tensors
    result = output_value(match)
    return (
        one_kind([x, w, b], dtypes=None)
        and b.dtype != torch.bool
        and b.dim() <= 2
        and isinstance(result, torch.Tensor)
        and result.dtype == x.dtype
        and same_shape(result.shape, (x.shape[0], w.shape[1]))
    )


def register(pass_dict: Any) -> None:
    add_replacement(
        pass_dict,
        search,
        replace,
        [torch.randn(2, 3), torch.randn(3, 4), torch.randn(4)],
        extra_check=fusable,
    )
