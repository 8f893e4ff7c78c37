"""Compute into dead intermediates in place (``inplace_pass``).

An AOTAutograd graph is functional: every op writes a new tensor, even where its input is never
read again. Where it is not, the op's in-place form reuses the input's memory:

    before: %h = aten.mm(%x, %w); %r = aten.relu(%h); %y = aten.mul(%r, 2)
    after:  %h = aten.mm(%x, %w); %r = aten.relu_(%h); %y = aten.mul_(%r, 2)

Conditions, each needed for the result to be the same: the input is made by the graph itself (a
fresh tensor, not a graph input, a view or an op that returns an alias); it has the result's sizes,
strides and dtype; no other argument of the op aliases it; it is not a graph output; and nothing
reads it, or a view of it, after the op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch._ops import OpOverload

from npugraph_ex.config import Config
from npugraph_ex.passes.graph_facts import (
    aliases_of,
    fake_value,
    node_order,
    readers_after,
    same_layout,
    write_in_place,
)
from npugraph_ex.schemas import inplace_overload


def writes_first_argument(node: torch.fx.Node) -> bool:
    """An in-place op: returns its first argument, written."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or len(schema.returns) != 1:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and alias.is_write and isinstance(node.args[0], torch.fx.Node)


def owns_fresh_memory(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a tensor the graph made (directly, or written in place since)."""
    while writes_first_argument(node):
        node = node.args[0]
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or len(schema.returns) != 1:
        return False
    return schema.returns[0].alias_info is None and not schema.is_mutable


def dead_after(value: torch.fx.Node, op: torch.fx.Node, order: dict[torch.fx.Node, int]) -> bool:
    aliases = aliases_of(value)
    if any(user.op == "output" for alias in aliases for user in alias.users):
        return False
    if any(reader is not op for reader in readers_after(aliases, order[op] - 1, order)):
        return False
    other_arguments: list[torch.fx.Node] = []
    torch.fx.node.map_arg((op.args[1:], op.kwargs), other_arguments.append)
    return not aliases.intersection(other_arguments)


def reinplace(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config) -> None:
    graph = gm.graph
    order = node_order(graph)
    for op in list(graph.nodes):
        if op.op != "call_function" or not op.args or not isinstance(op.args[0], torch.fx.Node):
            continue
        value = op.args[0]
        if not isinstance(op.target, OpOverload) or inplace_overload(op.target) is None:
            continue
        if not owns_fresh_memory(value):
            continue
        if not same_layout(fake_value(op), fake_value(value)) or not dead_after(value, op, order):
            continue
        position = order.pop(op)
        order[write_in_place(graph, op)] = position
