"""Write ``cat`` inputs straight into the result (``remove_cat_ops``).

A ``cat`` copies every input into a new tensor. Where an input is made only for the ``cat``, its
producer can write into its slice of the result instead, through its ``out=`` overload:

    before: %n = aten.neg(%a); %c = aten.cat([%n, %b], -1)
    after:  %c = aten.empty_strided(...); aten.neg.out(%a, out=aten.slice(%c, -1, 0, 32))
            aten.copy_(aten.slice(%c, -1, 32, 64), %b)

Inputs made elsewhere (graph inputs, views, tensors with other users) are copied into their
slice, as ``cat`` itself would. Applied only to static shapes, and only where at least one
producer writes in place (otherwise nothing is saved).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.passes.graph_facts import fake_value, node_order, with_fake_value
from npugraph_ex.schemas import TENSOR_OPTION_ARGS, out_variant

aten = torch.ops.aten


def static(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and all(
        isinstance(n, int) for n in (*value.shape, *value.stride())
    )


def made_only_for(node: Any, cat: torch.fx.Node) -> bool:
    """Whether ``node`` is a fresh tensor whose only use is one slot of ``cat``'s list."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    schema = getattr(node.target, "_schema", None)
    if schema is None or schema.is_mutable or len(schema.returns) != 1:
        return False
    if schema.returns[0].alias_info is not None or list(node.users) != [cat]:
        return False
    if fake_value(node).dtype != fake_value(cat).dtype:  # cat promotes; an out= write may not
        return False
    return cat.args[0].count(node) == 1 and out_variant(node.target) is not None


def skipped_by_cat(value: Any, result: Any) -> bool:
    """A 1-d empty tensor among inputs of more dims: ``cat`` skips it (an empty cache's start)."""
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 1
        and value.shape[0] == 0
        and result.dim() != 1
    )


def cat_parts(cat: torch.fx.Node) -> tuple[list[Any], int] | None:
    """The inputs of a static-shape ``cat`` worth rewriting, and its (non-negative) dim."""
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    result = fake_value(cat)
    inputs = [i for i in cat.args[0] if not skipped_by_cat(fake_value(i), result)]
    if not static(result) or not all(static(fake_value(i)) for i in inputs):
        return None
    if not any(made_only_for(i, cat) for i in inputs):
        return None
    return list(inputs), dim % result.dim()


def write_into_slices(graph: torch.fx.Graph, cat: torch.fx.Node, inputs: list, dim: int) -> None:
    result = fake_value(cat)
    producers = [i for i in inputs if made_only_for(i, cat)]
    order = node_order(graph)
    with graph.inserting_before(min(producers, key=order.__getitem__)):
        buffer = graph.call_function(
            aten.empty_strided.default,
            (list(result.shape), list(result.stride())),
            {"dtype": result.dtype, "device": result.device},
        )
        buffer.meta["val"] = result
    start = 0
    for node in inputs:
        length = fake_value(node).shape[dim]
        anchor = node if node in producers else cat
        with graph.inserting_before(anchor):
            part = graph.call_function(aten.slice.Tensor, (buffer, dim, start, start + length))
            with_fake_value(part, aten.slice.Tensor)
            if node in producers:
                out_op, (out_name,) = out_variant(node.target)
                kwargs = {k: v for k, v in node.kwargs.items() if k not in TENSOR_OPTION_ARGS}
                written = graph.call_function(out_op, node.args, {**kwargs, out_name: part})
            else:
                written = graph.call_function(aten.copy_.default, (part, node))
            written.meta["val"] = fake_value(part)
        start += length
    cat.replace_all_uses_with(buffer)
    graph.erase_node(cat)
    for producer in producers:
        graph.erase_node(producer)


def remove_cat_ops(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.cat.default:
            parts = cat_parts(node)
            if parts is not None:
                write_into_slices(graph, node, *parts)
