"""What a built-in pattern checks about the values it binds before it replaces them.

Inductor's matcher binds a pattern's arguments to whatever the graph holds in their place: a
tensor of any dtype, device, rank or layout, or a plain Python number where the graph adds a
constant (``a @ b + 1`` binds the bias to ``1``). A replacement that takes a tensor there, or
that cannot broadcast, promote or mix devices as the ops it replaces did, would fail or change
the results. Each built-in pattern says what its replacement needs with these helpers; none of
them adds a guard on a symbolic size (a pass runs after Dynamo has installed its guards).
Aliasing needs no check of its own: the matcher refuses a match with an in-place op among or
between its nodes (Inductor's mutation regions), and a match whose intermediate values are used
outside it.

    bound:    a @ b + 1                  ->  b = 1 (a number): refused, the graph is left as is
    bound:    a @ b + c, c: [M, 1] int64 ->  c of another dtype than the product: refused
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from npugraph_ex.passes.graph_facts import fake_value, known_equal

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def bound(match: Any, name: str, default: Any = None) -> Any:
    """The value bound to the pattern argument ``name``: a node's fake value, or the literal."""
    return fake_value(match.kwargs.get(name, default))


def bound_tensors(match: Any, *names: str) -> list[torch.Tensor] | None:
    """The fake tensors bound to ``names``, or None where one of them is not a tensor (a number,
    a missing value)."""
    values = [bound(match, name) for name in names]
    if all(isinstance(value, torch.Tensor) for value in values):
        return values
    return None


def is_number(value: Any) -> bool:
    """A plain Python int or float (not a bool, a 0-d tensor or a symbolic number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def one_kind(
    tensors: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype] | None = FLOATS
) -> bool:
    """Every tensor of one dtype, among ``dtypes`` (None: any), and on one device."""
    first = tensors[0]
    return (dtypes is None or first.dtype in dtypes) and all(
        t.dtype == first.dtype and t.device == first.device for t in tensors
    )


def one_bias_per_row(b: Any, w: torch.Tensor) -> bool:
    """A bias of one value per row of weight ``w`` (``nn.Linear``'s), of its dtype (float32) and
    device."""
    return (
        isinstance(b, torch.Tensor)
        and one_kind([w, b], (torch.float32,))
        and b.dim() == 1
        and isinstance(b.shape[0], int)  # comparing a symbolic size would add a guard
        and b.shape[0] == w.shape[0]
    )


def same_shape(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Two shapes equal for every value of their symbols."""
    return known_equal(list(a), list(b))


def broadcasts_to(shape: Sequence[Any], target: Sequence[Any]) -> bool:
    """``shape`` broadcasts to ``target`` without growing it: no more dims, and each of its
    trailing dims 1 or equal to the target's."""
    if len(shape) > len(target):
        return False
    return all(
        statically_known_true(size == 1) or statically_known_true(size == wanted)
        for size, wanted in zip(reversed(shape), reversed(target), strict=False)
    )


def output_value(match: Any) -> Any:
    """The fake value of the node the match replaces."""
    return fake_value(match.output_node())
