"""Write ``cat`` inputs straight into the result (``remove_cat_ops``).

A ``cat`` copies every input into a new tensor. Where an input is made only for the ``cat``, its
producer can write into its slice of the result instead, through its ``out=`` overload:

    before: %n = aten.neg(%a); %c = aten.cat([%n, %b], -1)
    after:  %c = aten.empty_strided(...); aten.neg.out(%a, out=aten.slice(%c, -1, 0, 32))
            aten.copy_(aten.slice(%c, -1, 32, 64), %b)

Inputs made elsewhere (graph inputs, views, tensors with other users) are copied into their
slice, as ``cat`` itself would. Applied only where at least one producer writes in place
(otherwise nothing is saved).

Symbolic sizes (``torch.compile(dynamic=True)``) are read from the graph's SymInt inputs, or
from int arithmetic the graph already does, and what is held nowhere is rebuilt as int
arithmetic on those, placed before the result is allocated, so one graph serves every size:

    before: %n = aten.neg(%a); %c = aten.cat([%n, %b])        a: [s0, 4], b: [s1, 4]
    after:  %end = operator.add(%s0, %s1); %c = aten.empty_strided([%end, 4], [4, 1])
            aten.neg.out(%a, out=aten.slice(%c, 0, 0, %s0))
            aten.copy_(aten.slice(%c, 0, %s0, %end), %b)     %s0, %s1: the graph's SymInt inputs

Each captured key has concrete sizes: the arithmetic runs once at its capture, and the replay
writes at that key's offsets. No size is compared, so no guard is added. A ``cat`` is kept where
a size depends on data and is known only after its first part is made, or uses arithmetic the
pass does not rebuild; the reason is logged once at DEBUG with its source line.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._sympy import functions as size_functions

from npugraph_ex.config import Config
from npugraph_ex.debug.once import log_once
from npugraph_ex.debug.source import source_line
from npugraph_ex.passes.graph_facts import fake_value, node_order, with_fake_value
from npugraph_ex.schemas import TENSOR_OPTION_ARGS, out_variant

log = logging.getLogger(__name__)

aten = torch.ops.aten

SIZE_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    sympy.Add: operator.add,
    sympy.Mul: operator.mul,
    size_functions.FloorDiv: operator.floordiv,
    size_functions.CleanDiv: operator.floordiv,
    size_functions.PythonMod: operator.mod,
    size_functions.Mod: operator.mod,  # sizes are non-negative: C and Python remainders agree
    sympy.Mod: operator.mod,
    size_functions.PowByNatural: operator.pow,
    size_functions.Max: torch.sym_max,
    size_functions.Min: torch.sym_min,
}
"""The sympy functions of a size expression, and the int operation each is rebuilt as (the
ones Dynamo records on SymInts, which every runtime computes on the host)."""

COMMUTATIVE = frozenset({sympy.Add, sympy.Mul, size_functions.Max, size_functions.Min})
"""Those of ``SIZE_ARITHMETIC`` whose terms may be reordered (sympy gives them any number)."""


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
    """A 1-d empty tensor among inputs of more dims: ``cat`` skips it (an empty cache's start).

    Asked without a guard: a symbolic length is not known to be 0 (tracing ``cat`` refuses a 1-d
    input of a length that might not be)."""
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 1
        and result.dim() != 1
        and statically_known_true(value.shape[0] == 0)
    )


@dataclass(frozen=True)
class CatPlan:
    """A ``cat`` to rewrite: its parts (the inputs ``cat`` does not skip), its non-negative dim,
    each part's start and end along it (ints, or SymInts where sizes are symbolic), and the first
    producer in graph order, before which the result is allocated."""

    parts: list[Any]
    dim: int
    bounds: list[tuple[Any, Any]]
    first_write: torch.fx.Node


def plan_cat(cat: torch.fx.Node, sizes: SizeNodes) -> CatPlan | str:
    """The rewrite of ``cat``, or why it is kept."""
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    result = fake_value(cat)
    if not isinstance(result, torch.Tensor):
        return "its result has no fake value"
    inputs = [i for i in cat.args[0] if not skipped_by_cat(fake_value(i), result)]
    producers = [i for i in inputs if made_only_for(i, cat)]
    if not producers:
        return "no input is made only for it (nothing to save)"
    dim %= result.dim()
    bounds, start = [], 0
    for node in inputs:
        end = start + fake_value(node).shape[dim]
        bounds.append((start, end))
        start = end
    first_write = min(producers, key=sizes.order.__getitem__)
    needed = [*result.shape, *result.stride(), *(n for bound in bounds for n in bound)]
    reason = sizes.missing(needed, first_write)
    return reason if reason is not None else CatPlan(inputs, dim, bounds, first_write)


class SizeNodes:
    """Where each symbolic size of a graph can be read at run time, and the int arithmetic that
    rebuilds, from those, the sizes a rewrite needs at a point of the graph.

    A size is read from a node before that point which holds it: a SymInt graph input (Dynamo
    passes one per symbol of its inputs' sizes), or int arithmetic the graph does anyway (the
    ``TruncToInt(1.5*s0)`` of an interpolation, the length of a data-dependent selection); a
    symbol no such node holds, as ``aten.sym_size.int`` of a graph input's dimension. Sizes held
    nowhere are rebuilt from these with ``SIZE_ARITHMETIC``. Nothing is compared, so no guard is
    added.
    """

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.order = node_order(graph)
        self.held: dict[sympy.Expr, torch.fx.Node] = {}
        self.dims: dict[sympy.Expr, tuple[torch.fx.Node, int]] = {}
        for node in graph.nodes:
            value = fake_value(node)
            if isinstance(value, torch.SymInt):
                self.held.setdefault(value.node.expr, node)
            elif node.op == "placeholder" and isinstance(value, torch.Tensor):
                for index, size in enumerate(value.shape):
                    if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                        self.dims.setdefault(size.node.expr, (node, index))

    def holder(self, expr: sympy.Expr, point: torch.fx.Node) -> torch.fx.Node | None:
        """The node before ``point`` that holds ``expr``, or None."""
        node = self.held.get(expr)
        return node if node is not None and self.order[node] < self.order[point] else None

    def missing(self, values: Sequence[Any], point: torch.fx.Node) -> str | None:
        """Why one of ``values`` (ints and SymInts) cannot be had before ``point``, or None."""
        for value in values:
            if isinstance(value, torch.SymInt):
                reason = self.missing_expr(value.node.expr, point)
                if reason is not None:
                    return f"its size {value.node.expr} {reason}"
        return None

    def missing_expr(self, expr: sympy.Expr, point: torch.fx.Node) -> str | None:
        """Why ``expr`` cannot be had before ``point``, or None."""
        if isinstance(expr, sympy.Integer) or self.holder(expr, point) or expr in self.dims:
            return None
        if isinstance(expr, sympy.Symbol):
            return f"uses {expr}, which no graph input or node before its first written part holds"
        if isinstance(expr, sympy.Pow) and positive_integer(expr.exp):
            return self.missing_expr(expr.base, point)
        if type(expr) not in SIZE_ARITHMETIC:
            return f"uses {type(expr).__name__}, which the pass does not rebuild"
        reasons = (self.missing_expr(arg, point) for arg in expr.args)
        return next((reason for reason in reasons if reason is not None), None)

    def builder(self, point: torch.fx.Node) -> Callable[[Any], Any]:
        """A function from an int or SymInt to that int or a node computing it, emitted at the
        graph's insertion point (before ``point``); equal expressions share one node."""
        built: dict[sympy.Expr, Any] = {}

        def build(expr: sympy.Expr) -> Any:
            if expr not in built:
                built[expr] = self.build_expr(expr, point, build)
            return built[expr]

        return lambda value: build(value.node.expr) if isinstance(value, torch.SymInt) else value

    def build_expr(
        self, expr: sympy.Expr, point: torch.fx.Node, build: Callable[[sympy.Expr], Any]
    ) -> Any:
        """Nodes computing ``expr`` (which ``missing_expr`` accepts), its parts by ``build``."""
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if (node := self.holder(expr, point)) is not None:
            return node
        if expr in self.dims:
            tensor, index = self.dims[expr]
            size = self.graph.call_function(aten.sym_size.int, (tensor, index))
            size.meta["val"] = fake_value(tensor).shape[index]
            return size
        if isinstance(expr, sympy.Pow):
            return self.emit(operator.pow, build(expr.base), int(expr.exp))
        op = SIZE_ARITHMETIC[type(expr)]
        if type(expr) not in COMMUTATIVE:
            left, right = expr.args
            return self.emit(op, build(left), build(right))
        # Ints last (``s0 - 1`` is ``operator.add(%s0, -1)``); more than two terms fold from the
        # left through their partial sums, so an offset is reused by the next one.
        *rest, last = sorted(expr.args, key=lambda arg: isinstance(arg, sympy.Integer))
        left = build(rest[0] if len(rest) == 1 else expr.func(*rest))
        return self.emit(op, left, build(last))

    def emit(self, op: Callable[[Any, Any], Any], left: Any, right: Any) -> torch.fx.Node:
        node = self.graph.call_function(op, (left, right))
        node.meta["val"] = op(fake_value(left), fake_value(right))
        return node


def positive_integer(value: Any) -> bool:
    return isinstance(value, sympy.Integer) and value > 0


def write_into_slices(
    graph: torch.fx.Graph, cat: torch.fx.Node, plan: CatPlan, sizes: SizeNodes
) -> None:
    result = fake_value(cat)
    producers = [i for i in plan.parts if made_only_for(i, cat)]
    size = sizes.builder(plan.first_write)
    with graph.inserting_before(plan.first_write):
        # Every size is had here, before the first write: a later part's offset may be needed
        # by a producer that comes earlier in the graph.
        shape, stride = [size(n) for n in result.shape], [size(n) for n in result.stride()]
        bounds = [(size(start), size(end)) for start, end in plan.bounds]
        buffer = graph.call_function(
            aten.empty_strided.default,
            (shape, stride),
            {"dtype": result.dtype, "device": result.device},
        )
        buffer.meta["val"] = result
    for node, (start, end) in zip(plan.parts, bounds, strict=True):
        anchor = node if node in producers else cat
        with graph.inserting_before(anchor):
            part = graph.call_function(aten.slice.Tensor, (buffer, plan.dim, start, end))
            with_fake_value(part, aten.slice.Tensor)
            if node in producers:
                out_op, (out_name,) = out_variant(node.target)
                kwargs = {k: v for k, v in node.kwargs.items() if k not in TENSOR_OPTION_ARGS}
                written = graph.call_function(out_op, node.args, {**kwargs, out_name: part})
            else:
                written = graph.call_function(aten.copy_.default, (part, node))
            written.meta["val"] = fake_value(part)
    cat.replace_all_uses_with(buffer)
    graph.erase_node(cat)
    for producer in producers:
        graph.erase_node(producer)


def remove_cat_ops(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config) -> None:
    graph = gm.graph
    sizes = SizeNodes(graph)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.cat.default:
            continue
        plan = plan_cat(node, sizes)
        if isinstance(plan, CatPlan):
            write_into_slices(graph, node, plan, sizes)
        else:
            where = source_line(node)
            log_once(
                log,
                logging.DEBUG,
                ("remove_cat_ops", where, plan),
                "remove_cat_ops: kept %s at %s: %s",
                node.name,
                where,
                plan,
            )
