"""Remove ops that return their input unchanged (``remove_noop_ops``).

    before: %c = aten.clone(%x); %m = aten.mul(%c, 1); %v = aten.view(%m, [4, 8]); %y = f(%v)
    after:  %y = f(%x)                                  (when %x is already 4x8, contiguous)

Two kinds, both only where the result has its input's sizes, strides and dtype:

- *copies* (``clone``, same-dtype ``_to_copy`` / ``convert_element_type``, a one-input ``cat``,
  ``x * 1``, ``x + 0``, ``x - 0``, ``x / 1``, ``pow(x, 1)``): each makes a new tensor, so dropping
  it makes its users share memory with its input. That is done only where nothing writes either
  side (so the sharing cannot be observed) and neither the copy nor a view of it is a graph
  output (so no new aliasing between an input and an output, or between two outputs, appears:
  ``(x * 1.0).t()`` returned a view of the caller's ``x``);
- *views* of the whole tensor (same-shape ``view``/``reshape``/``_unsafe_view``/``expand``,
  full ``slice`` however its end is written, ``alias``): they alias their input already; kept
  where they are graph outputs.

A copy into a fresh tensor (``torch.zeros_like(x).copy_(x)``, also ``empty_like``, ``full_like``
and the other factories) is a clone of its source: it becomes one first, the factory goes, and
the clone is then removed as above where it can be:

    before: %z = aten.zeros_like(%x); %c = aten.copy(%z, %x); %y = f(%c)
    after:  %y = f(%x)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from npugraph_ex.config import Config
from npugraph_ex.passes.graph_facts import aliases_of, fake_value, is_view, same_layout

aten = torch.ops.aten
prims = torch.ops.prims


def arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def identity_operand(value: int) -> Callable[[torch.fx.Node], bool]:
    """``op(x, value)`` with a Python number ``value`` (and no ``alpha`` other than 1)."""

    def check(node: torch.fx.Node) -> bool:
        if len(node.args) > 1:
            operand = node.args[1]
        else:
            operand = node.kwargs.get("other", node.kwargs.get("exponent"))
        alpha = node.kwargs.get("alpha", 1)
        return isinstance(operand, (int, float)) and operand == value and alpha == 1

    return check


def same_dtype_copy(node: torch.fx.Node) -> bool:
    allowed = {"dtype", "layout", "device", "memory_format", "pin_memory", "non_blocking"}
    return set(node.kwargs) <= allowed and node.kwargs.get("memory_format") in (
        None,
        torch.preserve_format,
    )


def full_slice(node: torch.fx.Node) -> bool:
    """A slice from 0 with step 1 (its result has its input's shape: ``removable`` checks it), so
    it ends at or past the end, however the end is written: a number, ``sys.maxsize`` (Dynamo's
    ``x[:]`` with dynamic shapes) or a symbolic size equal to the dim's."""
    start, step = fake_value(arg(node, 2, "start")), fake_value(arg(node, 4, "step", 1))
    return (start is None or statically_known_true(start == 0)) and statically_known_true(step == 1)


def one_input_cat(node: torch.fx.Node) -> bool:
    tensors = node.args[0]
    return isinstance(tensors, (list, tuple)) and len(tensors) == 1


def always(node: torch.fx.Node) -> bool:
    return True


COPIES: dict[Any, Callable[[torch.fx.Node], bool]] = {
    aten.clone.default: always,
    aten._to_copy.default: same_dtype_copy,
    prims.convert_element_type.default: always,
    aten.cat.default: one_input_cat,
    aten.mul.Tensor: identity_operand(1),
    aten.mul.Scalar: identity_operand(1),
    aten.div.Tensor: identity_operand(1),
    aten.div.Scalar: identity_operand(1),
    aten.add.Tensor: identity_operand(0),
    aten.add.Scalar: identity_operand(0),
    aten.sub.Tensor: identity_operand(0),
    aten.sub.Scalar: identity_operand(0),
    aten.pow.Tensor_Scalar: identity_operand(1),
}

VIEWS: dict[Any, Callable[[torch.fx.Node], bool]] = {
    aten.view.default: always,
    aten.reshape.default: always,
    aten._unsafe_view.default: always,
    aten.expand.default: always,
    aten.alias.default: always,
    aten.slice.Tensor: full_slice,
}


FRESH_FACTORIES = {
    aten.zeros_like.default,
    aten.empty_like.default,
    aten.full_like.default,
    aten.ones_like.default,
    aten.zeros.default,
    aten.empty.memory_format,
    aten.full.default,
    aten.ones.default,
    aten.new_zeros.default,
    aten.new_empty.default,
    aten.new_full.default,
    aten.new_ones.default,
}
"""Ops that make a new tensor whose values a ``copy`` into all of it makes irrelevant."""


def copy_into_fresh(node: torch.fx.Node) -> torch.fx.Node | None:
    """For ``copy(factory(...), src)`` (``torch.zeros_like(x).copy_(x)``, functionalised) whose
    factory is used by the copy alone and whose result has ``src``'s layout: ``src``. The copy
    writes every element (it broadcasts ``src``), so it is ``clone(src)``."""
    if node.target is not aten.copy.default or len(node.args) < 2:
        return None
    fresh, source = node.args[0], node.args[1]
    if not isinstance(fresh, torch.fx.Node) or not isinstance(source, torch.fx.Node):
        return None
    if fresh.target not in FRESH_FACTORIES or len(fresh.users) != 1:
        return None
    if not same_layout(fake_value(node), fake_value(source)):
        return None
    return source


def clone_copies_into_fresh(graph: torch.fx.Graph) -> None:
    """Rewrite ``copy(factory(...), src)`` as ``clone(src)``, dropping the factory; the clone is
    then removed like any other where nothing can observe it."""
    for node in list(graph.nodes):
        source = copy_into_fresh(node)
        if source is None:
            continue
        fresh = node.args[0]
        with graph.inserting_before(node):
            clone = graph.call_function(aten.clone.default, (source,))
        clone.meta = dict(node.meta)
        node.replace_all_uses_with(clone)
        graph.erase_node(node)
        graph.erase_node(fresh)


def source_of(node: torch.fx.Node) -> torch.fx.Node | None:
    source = node.args[0] if node.args else None
    if node.target is aten.cat.default and isinstance(source, (list, tuple)):
        source = source[0]
    return source if isinstance(source, torch.fx.Node) else None


def root_of(node: torch.fx.Node) -> torch.fx.Node:
    while is_view(node) and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def is_written(node: torch.fx.Node) -> bool:
    """Whether any op writes ``node``'s memory (through any view of it)."""
    for alias in aliases_of(node):
        for user in alias.users:
            schema = getattr(user.target, "_schema", None)
            if schema is None or not schema.is_mutable:
                continue
            for position, argument in enumerate(schema.arguments):
                value = user.args[position] if position < len(user.args) else None
                value = user.kwargs.get(argument.name, value)
                if value is alias and argument.alias_info and argument.alias_info.is_write:
                    return True
    return False


def is_output(node: torch.fx.Node) -> bool:
    return any(user.op == "output" for user in node.users)


def reaches_output(node: torch.fx.Node) -> bool:
    """Whether the node, or a view of it, is a graph output."""
    return any(is_output(alias) for alias in aliases_of(node))


def removable(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node's input, if the node can be replaced by it."""
    check = COPIES.get(node.target) or VIEWS.get(node.target)
    source = source_of(node) if node.op == "call_function" else None
    if check is None or source is None or is_output(node):
        return None
    if not same_layout(fake_value(node), fake_value(source)) or not check(node):
        return None
    if node.target in COPIES and (
        is_written(root_of(source)) or is_written(node) or reaches_output(node)
    ):
        return None
    return source


def remove_noop_ops(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> None:
    graph = gm.graph
    clone_copies_into_fresh(graph)
    for node in list(graph.nodes):
        source = removable(node)
        if source is not None:
            node.replace_all_uses_with(source)
            graph.erase_node(node)
