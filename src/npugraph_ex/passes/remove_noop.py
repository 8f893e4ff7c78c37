"""Remove ops that return their input unchanged (``remove_noop_ops``).

    before: %c = aten.clone(%x); %m = aten.mul(%c, 1); %v = aten.view(%m, [4, 8]); %y = f(%v)
    after:  %y = f(%x)                                  (when %x is already 4x8, contiguous)

Two kinds, both only where the result has its input's sizes, strides and dtype:

- *copies* (``clone``, same-dtype ``_to_copy`` / ``convert_element_type``, a one-input ``cat``,
  ``x * 1``, ``x + 0``, ``x - 0``, ``x / 1``, ``pow(x, 1)``): each makes a new tensor, so dropping
  it makes its users share memory with its input. That is done only where nothing writes either
  side (so the sharing cannot be observed) and the copy is not a graph output (so no new aliasing
  between an input and an output, or between two outputs, appears);
- *views* of the whole tensor (same-shape ``view``/``reshape``/``_unsafe_view``/``expand``,
  full ``slice``, ``alias``): they alias their input already; kept where they are graph outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

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
    value = fake_value(node.args[0])
    dim = arg(node, 1, "dim", 0)
    start, end, step = arg(node, 2, "start"), arg(node, 3, "end"), arg(node, 4, "step", 1)
    size = value.shape[dim] if isinstance(value, torch.Tensor) else None
    if not isinstance(size, int) or not all(isinstance(v, (int, type(None))) for v in (start, end)):
        return False
    return step == 1 and start in (None, 0) and (end is None or end >= size)


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


def removable(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node's input, if the node can be replaced by it."""
    check = COPIES.get(node.target) or VIEWS.get(node.target)
    source = source_of(node) if node.op == "call_function" else None
    if check is None or source is None or is_output(node):
        return None
    if not same_layout(fake_value(node), fake_value(source)) or not check(node):
        return None
    if node.target in COPIES and (is_written(root_of(source)) or is_written(node)):
        return None
    return source


def remove_noop_ops(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        source = removable(node)
        if source is not None:
            node.replace_all_uses_with(source)
            graph.erase_node(node)
