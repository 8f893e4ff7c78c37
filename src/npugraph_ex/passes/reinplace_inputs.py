"""Write graph inputs in place: "functional op, then copy back into the input" becomes the op's
in-place form on the input (``input_inplace_pass``).

AOTAutograd turns ``cache.index_copy_(2, pos, k)`` into a functional ``index_copy`` of the whole
cache and a ``copy_`` of the result back into the input at the end of the graph: two full copies
of the cache per write. This pass writes the input directly:

    before: %ic = aten.index_copy(%cache, 2, %pos, %k); %o = f(%ic); aten.copy_(%cache, %ic)
    after:  %ic = aten.index_copy_(%cache, 2, %pos, %k); %o = f(%ic)

The same where the function returns the input it wrote (``x.add_(1); return x``: the graph
returns the ``copy_``); the input is returned instead:

    before: %a = aten.add(%x, 1); %c = aten.copy_(%x, %a); return (%c,)
    after:  %a = aten.add_(%x, 1); return (%x,)

Scatters without an in-place form become a view of the input and a ``copy_`` into it:

    before: %s = aten.slice_scatter(%buf, %src, 1, 0, 4); aten.copy_(%buf, %s)
    after:  %v = aten.slice(%buf, 1, 0, 4); aten.copy_(%v, %src)       (uses of %s read %buf)

It applies only where the result is the same: the op's first argument is the input itself, the
result has the input's sizes, strides and dtype, no other argument of the op aliases the input, and
nothing reads the input (or a view of it) after the op except through the op's result.

Custom ops that mutate an input (``auto_functionalized`` in the graph) are called in place again
by ``reinplace_custom_ops``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.passes.graph_facts import (
    aliases_of,
    fake_value,
    node_order,
    readers_after,
    same_layout,
    with_fake_value,
    write_in_place,
)
from npugraph_ex.passes.reinplace_custom_ops import reinplace_custom_ops
from npugraph_ex.schemas import inplace_overload

aten = torch.ops.aten

SCATTERS_INTO_VIEW = {
    aten.slice_scatter.default: (aten.slice.Tensor, ("dim", "start", "end", "step")),
    aten.select_scatter.default: (aten.select.int, ("dim", "index")),
}
"""Scatters written as a view of the destination (with the scatter's arguments) and a copy."""


def write_back_of(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """For ``copy_(input, op(input, ...))`` whose result is unused or only returned (a function
    that writes an input and returns it): (input, op node)."""
    if node.target is not aten.copy_.default or len(node.args) != 2:
        return None
    if any(user.op != "output" for user in node.users):
        return None
    target, source = node.args
    if not isinstance(target, torch.fx.Node) or target.op != "placeholder":
        return None
    if not isinstance(source, torch.fx.Node) or source.op != "call_function":
        return None
    if not source.args or source.args[0] is not target:
        return None
    return target, source


def can_write_in_place(
    graph_input: torch.fx.Node,
    op: torch.fx.Node,
    write_back: torch.fx.Node,
    order: dict[torch.fx.Node, int],
) -> bool:
    if op.target not in SCATTERS_INTO_VIEW and inplace_overload(op.target) is None:
        return False
    if not same_layout(fake_value(op), fake_value(graph_input)):
        return False
    aliases = aliases_of(graph_input)
    other_arguments: list[torch.fx.Node] = []
    torch.fx.node.map_arg((op.args[1:], op.kwargs), other_arguments.append)
    if aliases.intersection(other_arguments):
        return False
    later = readers_after(aliases, order[op], order)
    return all(reader in (op, write_back) for reader in later)


def rewrite_in_place(graph: torch.fx.Graph, graph_input: torch.fx.Node, op: torch.fx.Node) -> None:
    if op.target in SCATTERS_INTO_VIEW:
        view_op, names = SCATTERS_INTO_VIEW[op.target]
        schema_names = [a.name for a in op.target._schema.arguments]
        bound = dict(zip(schema_names, op.args, strict=False)) | dict(op.kwargs)
        defaults = {a.name: a.default_value for a in op.target._schema.arguments}
        view_args = tuple(bound.get(name, defaults[name]) for name in names)
        with graph.inserting_before(op):
            view = graph.call_function(view_op, (graph_input, *view_args))
            with_fake_value(view, view_op)
            copy = graph.call_function(aten.copy_.default, (view, bound["src"]))
            copy.meta["val"] = fake_value(view)
        op.replace_all_uses_with(graph_input)
        graph.erase_node(op)
    else:
        write_in_place(graph, op)


def reinplace_inputs(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        found = write_back_of(node)
        if found is None:
            continue
        graph_input, op = found
        if not can_write_in_place(graph_input, op, node, node_order(graph)):
            continue
        # A returned write-back returns the input, which the in-place op writes.
        node.replace_all_uses_with(graph_input)
        graph.erase_node(node)
        rewrite_in_place(graph, graph_input, op)
    reinplace_custom_ops(graph)
