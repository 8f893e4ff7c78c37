"""What passes ask of a graph: node order, aliases of a value, fake values for new nodes, the
scopes (``npugraph_ex.scope``) a node lies in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from npugraph_ex.schemas import inplace_overload
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT, core_cap_of


def fake_value(node: Any) -> Any:
    if not isinstance(node, torch.fx.Node):
        return node
    return node.meta.get("val", node.meta.get("example_value"))


def known_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two size or stride lists are equal for every value of their symbols.

    Never adds a guard: a pass runs after Dynamo has installed its guards.
    """
    if len(a) != len(b):
        return False
    return all(statically_known_true(x == y) for x, y in zip(a, b, strict=True))


def same_layout(a: Any, b: Any) -> bool:
    """Whether two fake values are tensors of the same sizes, strides, dtype and device."""
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.device == b.device
        and known_equal(a.shape, b.shape)
        and known_equal(a.stride(), b.stride())
    )


def each_pair(a: Any, b: Any, tensors: Callable[[torch.Tensor, torch.Tensor], bool]) -> bool:
    """Whether two values hold the same structure (tuples and lists of one length, non-tensors
    where the other has them) and ``tensors`` holds for each pair of tensors in it."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(each_pair(x, y, tensors) for x, y in zip(a, b, strict=True))
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor)
    return tensors(a, b)


def same_result(a: Any, b: Any) -> bool:
    """Whether two values (tensors, or tuples and lists of them) hold one dtype and device per
    tensor and shapes not known to differ: what a computation that replaces another returns."""
    return each_pair(a, b, one_result)


def one_result(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.device == b.device
        and a.dim() == b.dim()
        and not any(statically_known_true(x != y) for x, y in zip(a.shape, b.shape, strict=True))
    )


def value_text(value: Any) -> str:
    """A value as an error names it: ``float32 [4, 8] on cpu`` for a tensor, each of a tuple's
    in brackets, a type's name otherwise."""
    if isinstance(value, (tuple, list)):
        return f"({', '.join(map(value_text, value))})"
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)} on {value.device}"
    return type(value).__name__


def is_view(node: torch.fx.Node) -> bool:
    """Whether the node's result aliases its first argument without writing it (a view op)."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def aliases_of(node: torch.fx.Node) -> set[torch.fx.Node]:
    """``node`` and every view taken of it, transitively."""
    found, pending = {node}, [node]
    while pending:
        for user in pending.pop().users:
            if user not in found and is_view(user) and user.args and user.args[0] in found:
                found.add(user)
                pending.append(user)
    return found


def readers_after(
    aliases: set[torch.fx.Node], position: int, order: dict[torch.fx.Node, int]
) -> list[torch.fx.Node]:
    """Nodes after ``position`` that use any of ``aliases`` (views among them excluded)."""
    return [
        user
        for alias in aliases
        for user in alias.users
        if user not in aliases and order[user] > position
    ]


def node_order(graph: torch.fx.Graph) -> dict[torch.fx.Node, int]:
    return {node: index for index, node in enumerate(graph.nodes)}


def with_fake_value(node: torch.fx.Node, compute: Callable[..., Any]) -> torch.fx.Node:
    """Set ``node.meta["val"]`` to ``compute`` run on its arguments' fake values."""
    args = torch.fx.node.map_arg(node.args, fake_value)
    kwargs = torch.fx.node.map_arg(node.kwargs, fake_value)
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    mode = torch._guards.detect_fake_mode(tensors)
    if mode is None:
        return node
    with mode:
        node.meta["val"] = compute(*args, **kwargs)
    return node


def write_in_place(graph: torch.fx.Graph, op: torch.fx.Node) -> torch.fx.Node:
    """Replace functional ``op`` by its in-place overload on its first argument; the new node."""
    with graph.inserting_before(op):
        written = graph.call_function(inplace_overload(op.target), op.args, op.kwargs)
    written.meta = dict(op.meta)
    written.meta["val"] = fake_value(op.args[0])
    op.replace_all_uses_with(written)
    graph.erase_node(op)
    return written


def has_scopes(graph: torch.fx.Graph) -> bool:
    return bool(graph.find_nodes(op="call_function", target=SCOPE_ENTER))


def within_one_scope(nodes: Sequence[torch.fx.Node]) -> bool:
    """Whether no scope edge lies between any two of ``nodes`` (fusing them moves none of their
    ops out of, or into, a scope)."""
    return len({scope_edge_before(node) for node in nodes}) <= 1


def scope_edge_before(node: torch.fx.Node) -> torch.fx.Node | None:
    """The nearest ``scope_enter``/``scope_exit`` before ``node`` in the graph, or None."""
    if not has_scopes(node.graph):
        return None
    previous = node.prev
    while previous.op != "root":
        if previous.target in (SCOPE_ENTER, SCOPE_EXIT):
            return previous
        previous = previous.prev
    return None


def core_cap_at(node: torch.fx.Node) -> int | None:
    """The fewest cores a ``limit_core_num`` block around ``node`` allows (the larger of its
    two numbers, as a CPU applies it), or None outside every such block."""
    if not has_scopes(node.graph):
        return None
    cap, depth, previous = None, 0, node.prev
    while previous.op != "root":
        if previous.target is SCOPE_EXIT:
            depth += 1
        elif previous.target is SCOPE_ENTER and depth > 0:
            depth -= 1
        elif previous.target is SCOPE_ENTER and (block_cap := core_cap_of(previous)) is not None:
            cap = block_cap if cap is None else min(cap, block_cap)
        previous = previous.prev
    return cap
