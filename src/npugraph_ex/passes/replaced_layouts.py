"""Views and outputs that a replacement's output layout no longer fits, given a copy that fits.

A pattern's replacement computes the values of what it replaces, but not always in the same
layout: an attention kernel lays its output out like its query where the written-out products
made it contiguous, a product may come out transposed. The graph's views past it were traced on
the old layout, and a view the new one cannot serve stops the replay ("view size is not
compatible with input tensor's size and stride"). After the patterns, the values from the
replaced nodes down are worked out again on fake tensors (only as far as a layout changed), and
such a view reads a contiguous copy of its input, as a reshape would:

    before: %o = mm(%b_t, %a_t) -> %t = t(%o) -> %flat = view(%t, [-1])          (fails)
    after:  %o = mm(%b_t, %a_t) -> %t = t(%o) -> %c = clone(%t, contiguous) -> view(%c, [-1])

A graph output whose layout changed is laid out again as it was, as eager returns it and
Inductor keeps it: a contiguous or channels-last one is copied so, a view (an expanded or a
sliced product) is taken again of its input so restored. So is the input of an ``as_strided``,
which reads memory as laid out (it would read other values, silently). An output that a
replacement made the graph's input (``(x + 0.5) - 0.5`` replaced by ``x``) is copied, as eager
gives a new tensor: the caller writing to it would write to its input. A view that still fits,
and every graph no replacement touched, stay as they are. A node whose value is not worked out
again (an op that writes in place, one without a fake kernel, a data-dependent size) ends the
walk there. A value past a replacement of another dtype, device or shape than traced (a user's
replacement that computes something else for these inputs) raises, which drops the pass for
this graph with one warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch._guards import detect_fake_mode

from npugraph_ex.errors import ReplacementError
from npugraph_ex.passes.graph_facts import (
    each_pair,
    fake_value,
    is_view,
    known_equal,
    same_layout,
    same_result,
    value_text,
)

aten = torch.ops.aten
VIEW = aten.view.default
STRIDED = aten.as_strided.default


@contextlib.contextmanager
def layouts_kept(graph: torch.fx.Graph) -> Iterator[None]:
    """Around replacements in ``graph``: afterwards, each view past a replacement whose input's
    layout it no longer fits reads a contiguous copy of that input, and each graph output whose
    layout changed gets its own back (``restore_outputs``)."""
    earlier = set(graph.nodes)
    outputs = [Output(fake_value(node), input_viewed(node)) for node in output_nodes(graph)]
    viewed = {node: fake_value(node.args[0]) for node in graph.nodes if is_view(node)}
    yield
    if set(graph.nodes) == earlier:
        return
    mode = detect_fake_mode([node.meta.get("val") for node in graph.find_nodes(op="placeholder")])
    if mode is not None:
        moved = Moved({node for node in graph.nodes if node not in earlier}, viewed, mode)
        fit_views(graph, earlier, moved)
        restore_outputs(graph, outputs, moved)


@dataclasses.dataclass
class Moved:
    """What the walk past the replacements finds: the nodes whose values are new or moved, each
    view's input as traced, and the fake mode of the values."""

    nodes: set[torch.fx.Node]
    viewed: dict[torch.fx.Node, Any]
    mode: Any


def fit_views(graph: torch.fx.Graph, earlier: set[torch.fx.Node], moved: Moved) -> None:
    """Work the values past the nodes not in ``earlier`` out again, as far as a layout changed
    (adding those to ``moved``), giving each view that no longer fits a contiguous copy of its
    input, and each ``as_strided`` (which reads its input's memory as laid out) its input in
    the layout it was traced on."""
    mode = moved.mode
    for node in list(graph.nodes):
        if node.op != "call_function" or node not in earlier:
            continue  # a replacement's own nodes were traced on their inputs' values
        if not any(source in moved.nodes for source in node.all_input_nodes):
            continue
        if node.target is STRIDED:
            source = laid_out_as_before(graph, node.args[0], moved.viewed[node], moved, node)
            node.args = (source, *node.args[1:])
        value = worked_out(node, mode)
        if value is None and node.target is VIEW:
            node.args = (copy_laid_out(graph, node.args[0], mode, node), *node.args[1:])
            value = worked_out(node, mode)
        if value is None:
            continue
        check_same_result(node, value, node.meta.get("val"))
        if not same_layouts(value, node.meta.get("val")):
            moved.nodes.add(node)
        node.meta["val"] = value


def check_same_result(node: torch.fx.Node, new: Any, old: Any) -> None:
    """Raise where ``node``'s value, worked out again past a replacement, is of another dtype,
    device or shape than the graph was traced with: a replacement computed something else. (A
    value not recorded, by a pass that left none, is not compared.)"""
    if old is None or new is None or same_result(new, old):
        return
    raise ReplacementError(
        f"a replacement changed what {node.name} ({node.target}) computes: "
        f"{value_text(new)} where the graph was traced with {value_text(old)}; a pattern "
        "registered with register_replacement returns other results than its search function "
        "for these inputs"
    )


@dataclasses.dataclass
class Output:
    """A graph output as traced: its value, and the graph input it is or views, if any."""

    value: Any
    input: torch.fx.Node | None


def input_viewed(node: Any) -> torch.fx.Node | None:
    """The graph input ``node`` is, or is a view of; None where it is neither."""
    while isinstance(node, torch.fx.Node) and is_view(node):
        node = node.args[0]
    return node if isinstance(node, torch.fx.Node) and node.op == "placeholder" else None


def restore_outputs(graph: torch.fx.Graph, before: list[Output], moved: Moved) -> None:
    """Give each graph output whose layout moved its layout of ``before`` back, as eager
    returns it and Inductor keeps it: a view (an expanded or sliced one) by taking it again of
    its input so restored, another value by a copy. An output that a replacement made a graph
    input (or a view of one) where it was not is copied: the caller writing to it would write
    to its input."""
    output = graph.output_node()
    nodes = output_nodes(graph)
    if len(nodes) != len(before):
        return
    restored = list(nodes)
    for index, (node, old) in enumerate(zip(nodes, before, strict=True)):
        if not isinstance(old.value, torch.Tensor):
            continue
        if node in moved.nodes:
            check_same_result(output, fake_value(node), old.value)
            restored[index] = laid_out_as_before(graph, node, old.value, moved, output)
        if old.input is None and input_viewed(restored[index]) is not None:
            layout = dense_layout(old.value) or torch.preserve_format
            restored[index] = copy_laid_out(graph, restored[index], moved.mode, output, layout)
    values = output.args[0]
    output.args = (type(values)(restored) if isinstance(values, (tuple, list)) else restored[0],)


def laid_out_as_before(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    before: Any,
    moved: Moved,
    at: torch.fx.Node,
) -> Any:
    """``node``, or where its layout moved from ``before``'s, a node of its values laid out so,
    put in before ``at``: a view taken again of its input so restored (the offset too), else a
    copy where ``before`` was contiguous or channels-last; ``node`` itself where neither
    restores it."""
    value = fake_value(node)
    if not isinstance(before, torch.Tensor) or not isinstance(value, torch.Tensor):
        return node
    if same_layouts(value, before):
        return node
    again = view_again(graph, node, before, moved, at)
    if again is not None:
        return again
    layout = dense_layout(before)
    return node if layout is None else copy_laid_out(graph, node, moved.mode, at, layout)


def view_again(
    graph: torch.fx.Graph, node: torch.fx.Node, before: torch.Tensor, moved: Moved, at: Any
) -> torch.fx.Node | None:
    """View ``node`` taken again, before ``at``, of its input laid out as traced, where that
    gives ``before``'s layout; None where it does not (or ``node`` was not a view as traced)."""
    if node not in moved.viewed:
        return None
    source = node.args[0]
    restored = laid_out_as_before(graph, source, moved.viewed[node], moved, at)
    if restored is source:
        return None
    with graph.inserting_before(at):
        again = graph.node_copy(node, lambda arg: restored if arg is source else arg)
    value = worked_out(again, moved.mode)
    if value is None or not same_layouts(value, before):
        graph.erase_node(again)
        return None
    again.meta["val"] = value
    return again


def output_nodes(graph: torch.fx.Graph) -> list[Any]:
    values = graph.output_node().args[0]
    return list(values) if isinstance(values, (tuple, list)) else [values]


def dense_layout(value: torch.Tensor) -> torch.memory_format | None:
    """The memory format that lays out ``value`` as it is, if one does."""
    for layout in (torch.contiguous_format, torch.channels_last):
        if layout is torch.channels_last and value.dim() != 4:
            continue
        if value.is_contiguous(memory_format=layout):
            return layout
    return None


def worked_out(node: torch.fx.Node, mode: Any) -> Any:
    """``node``'s value worked out from its inputs' recorded values; None where it cannot be."""
    if node.target is not operator.getitem and not (
        isinstance(node.target, torch._ops.OpOverload) and not node.target._schema.is_mutable
    ):
        return None  # an op that writes in place could change its inputs' recorded values
    values = torch.fx.node.map_arg((node.args, node.kwargs), fake_value)
    try:
        with mode:
            return node.target(*values[0], **values[1])
    except Exception:  # noqa: BLE001 - any failure leaves the node as it was
        return None


def copy_laid_out(
    graph: torch.fx.Graph,
    source: torch.fx.Node,
    mode: Any,
    before: torch.fx.Node,
    layout: torch.memory_format = torch.contiguous_format,
) -> torch.fx.Node:
    """A copy of ``source`` laid out as ``layout``, put in before ``before``."""
    with graph.inserting_before(before):
        copy = graph.call_function(aten.clone.default, (source,), {"memory_format": layout})
    with mode:
        copy.meta["val"] = source.meta["val"].clone(memory_format=layout)
    return copy


def same_layouts(new: Any, old: Any) -> bool:
    """Whether two values (tensors, or tuples of them) have one shape, stride and offset each,
    known for every value of their sizes."""
    return each_pair(new, old, one_layout)


def one_layout(new: torch.Tensor, old: torch.Tensor) -> bool:
    return same_layout(new, old) and known_equal([new.storage_offset()], [old.storage_offset()])
