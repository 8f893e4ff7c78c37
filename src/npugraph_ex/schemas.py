"""What ATen schemas say about an op: its ``out=`` overload, its in-place overload; which
higher-order ops are control flow.

Shared by the passes (which rewrite graphs into ``out=`` and in-place calls) and the CPU replay
engine (which re-issues recorded kernels through them); it knows no device.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx
from torch._ops import HigherOrderOperator, OpOverload

TENSOR_OPTION_ARGS = frozenset({"dtype", "layout", "device", "pin_memory"})
"""Factory arguments an ``out=`` overload takes from its ``out`` tensor instead."""

NON_BLOCKING_COPIES = {
    torch.ops.aten._to_copy.default: 0,
    torch.ops.aten.copy.default: 1,
    torch.ops.aten.copy_.default: 1,
}
"""Copy ops with a ``non_blocking`` argument, and the position of their source."""


CONTROL_FLOW = frozenset(
    op
    for name in ("cond", "while_loop", "scan", "map_impl", "flex_attention")
    if isinstance(op := getattr(torch.ops.higher_order, name, None), HigherOrderOperator)
)
"""Higher-order ops whose results are fresh (none aliases an operand), most of them choosing at
run time which kernels run (a predicate, a loop's condition). A branch may write its operands
(``torch.cond`` allows it without grad): ``analysis.writes_operands`` tells."""


def is_collective(op: Any) -> bool:
    """A functional collective (``_c10d_functional.all_reduce``, ...): it returns at once, its
    result complete after ``wait_tensor`` (which is not one)."""
    return (
        isinstance(op, OpOverload)
        and op.namespace == "_c10d_functional"
        and op.name() != "_c10d_functional::wait_tensor"
    )


def signature_of(op: OpOverload, *, drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """The (name, type) pairs of an op's non-out arguments, minus ``drop``."""
    return [
        (arg.name, str(arg.type))
        for arg in op._schema.arguments
        if not arg.is_out and arg.name not in drop
    ]


@functools.cache
def out_variant(
    op: OpOverload, numbers: frozenset[str] = frozenset()
) -> tuple[OpOverload, tuple[str, ...]] | None:
    """The ``out=`` overload computing the same thing as functional ``op``, and its out names.

    Matched by schema: the same non-out arguments, ignoring the tensor options of factories, and
    one out argument per return. Where the call passes Python numbers (``numbers``) for Tensor
    arguments, an overload taking them as Scalars is preferred: the Tensor one would allocate a
    wrapped scalar on every replay.
    """
    wanted = signature_of(op, drop=TENSOR_OPTION_ARGS)
    scalar_form = [
        (name, "number") if name in numbers and kind == "Tensor" else (name, kind)
        for name, kind in wanted
    ]
    found = {}
    packet = op.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        out_names = tuple(arg.name for arg in candidate._schema.arguments if arg.is_out)
        if len(out_names) != len(op._schema.returns) or not out_names:
            continue
        signature = signature_of(candidate, drop=TENSOR_OPTION_ARGS)
        if signature in (wanted, scalar_form):
            found[signature == scalar_form] = (candidate, out_names)
    return found.get(True, found.get(False))


def inplace_overload(op: OpOverload) -> OpOverload | None:
    """The in-place overload of a functional ATen op (``index_copy`` -> ``index_copy_``)."""
    packet = getattr(torch.ops.aten, op.overloadpacket.__name__ + "_", None)
    candidate = getattr(packet, op._overloadname, None) if packet is not None else None
    if candidate is None:
        return None

    def signature(o: OpOverload) -> list[tuple[str, str]]:
        return [(a.name, str(a.type)) for a in o._schema.arguments]

    return candidate if signature(candidate) == signature(op) else None


def argument_value(node: torch.fx.Node, name: str, default: Any = None) -> Any:
    """The value a call node passes for schema argument ``name``."""
    for position, argument in enumerate(node.target._schema.arguments):
        if argument.name == name:
            if position < len(node.args):
                return node.args[position]
            return node.kwargs.get(name, default)
    return default
