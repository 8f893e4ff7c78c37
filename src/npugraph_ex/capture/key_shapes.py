"""Rewrites that need constant sizes, applied per captured key of a graph with symbolic ones.

A graph compiled with ``dynamic=True`` holds symbolic sizes, so ``pattern_fusion_pass`` cannot
apply the rewrites that depend on a size: the split of a product of up to ``MAX_ROWS`` rows
over the threads (``passes/patterns/row_products.py``) needs its row count. Every captured key
has concrete sizes. Where a key's products have few enough rows, its graph is re-traced with that
key's sizes (every symbol a constant, as ``static_kernel_compile`` does for Inductor) and the
capture-only patterns run on the result, which the key captures instead of the symbolic graph:

    graph:     %y = mm(%x, t(%w))                            x: [s0, 256]
    key s0=4:  %y = bmm(view(%w, [2, N/2, 256]), ...)        the split, as a static graph has it
    key s0=20: the graph as it is (nothing to rewrite: no specialisation paid)

A batch or sequence that grows one row at a time (a generation loop without a KV cache, a decode
step over a dynamic batch) gets the same kernels for its few-row keys as a graph compiled for
one shape. The re-trace costs a few tens of milliseconds per such key; it is paid only where a
product's row count, read from the key's sizes, is within the split's reach (the last
``capture_limit`` graphs made are kept, for recaptures). ``force_eager`` runs the same graph for
each call's sizes, so it stays the reference of what a replay computes; the other eager calls
(past ``capture_limit``, after a failed capture) run the symbolic graph. A re-trace that fails
leaves the key on the symbolic graph (counted in ``stats()`` as ``key_specialisation["failed"]``,
said once at WARNING).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import first_line
from npugraph_ex.passes.graph_facts import fake_value
from npugraph_ex.passes.patterns.row_products import MAX_ROWS

log = logging.getLogger(__name__)

PRODUCTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
"""The ops whose row count decides whether a key is worth specialising."""


@dataclass(frozen=True)
class RowPlan:
    """How to read a graph's symbolic product row counts from a call's inputs: plain data, read
    once from the fake values after the passes (the compile cache stores it with the graph,
    which it keeps without them)."""

    rows: tuple[str, ...]
    """Each distinct symbolic row count, as a sympy expression's text."""
    sources: tuple[tuple[str, int, int | None], ...]
    """Per symbol: its name, the input it is read from, and the dim (None: the int input)."""

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> RowPlan | None:
        """The plan of ``gm`` (from its nodes' fake values), or None if no product of it has
        a symbolic row count."""
        rows = symbolic_rows(gm)
        if not rows:
            return None
        sources: dict[str, tuple[str, int, int | None]] = {}
        for index, node in enumerate(gm.graph.find_nodes(op="placeholder")):
            value = fake_value(node)
            sizes = [(None, value)] if isinstance(value, torch.SymInt) else []
            if isinstance(value, torch.Tensor):
                sizes = list(enumerate(value.shape))
            for dim, size in sizes:
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    name = size.node.expr.name
                    sources.setdefault(name, (name, index, dim))
        return cls(tuple(str(expr) for expr in rows), tuple(sources.values()))

    def counts(self, args: Sequence[Any]) -> list[int | None]:
        """Each row count for ``args`` (None where a symbol of it has no source)."""
        bound: dict[str, int] = {}
        for name, index, dim in self.sources:
            arg = args[index]
            bound[name] = int(arg if dim is None else arg.shape[dim])
        return [evaluate(expr, bound) for expr in self.rows]

    def has_few_rows(self, args: Sequence[Any]) -> bool:
        """Whether a product has at most ``MAX_ROWS`` rows for ``args``."""
        return any(count is not None and count <= MAX_ROWS for count in self.counts(args))


def symbolic_rows(gm: torch.fx.GraphModule) -> list[sympy.Expr]:
    """The row counts of ``gm``'s matrix products that are symbolic (deduplicated)."""
    rows: dict[sympy.Expr, None] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in PRODUCTS:
            continue
        left = node.args[1] if node.target is torch.ops.aten.addmm.default else node.args[0]
        value = fake_value(left) if isinstance(left, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            continue
        count = value.shape[0]
        if isinstance(count, torch.SymInt):
            rows[count.node.expr] = None
    return list(rows)


@functools.cache
def parsed(text: str) -> sympy.Expr:
    """``text`` as the expression it was printed from (torch's size functions included:
    ``FloorDiv``, ``ModularIndexing``, ...)."""
    import torch.utils._sympy.functions as size_functions

    return sympy.sympify(text, locals=vars(size_functions))


def evaluate(text: str, bound: dict[str, int]) -> int | None:
    """Expression ``text`` with its symbols replaced by ``bound``'s values (None where one is
    missing or the result is no integer)."""
    expr = parsed(text)
    if any(symbol.name not in bound for symbol in expr.free_symbols):
        return None
    value = expr.xreplace(
        {symbol: sympy.Integer(bound[symbol.name]) for symbol in expr.free_symbols}
    )
    return int(value) if getattr(value, "is_integer", False) else None


class KeySpecialiser:
    """Per key of one symbolic CPU graph: the graph re-traced with the key's sizes and the
    capture-only patterns applied, where some product has few enough rows to be rewritten."""

    def __init__(self, gm: torch.fx.GraphModule, plan: RowPlan, name: str, kept: int):
        self.gm = gm
        self.plan = plan
        self.name = name
        self.kept = kept
        self.made: OrderedDict[tuple, torch.fx.GraphModule | None] = OrderedDict()
        """The last ``kept`` graphs made, by input signature (None: nothing was rewritten, or
        the re-trace failed)."""

    def graph_for(self, args: Sequence[Any], counts: Counter) -> torch.fx.GraphModule | None:
        """The graph for ``args``' sizes in place of the symbolic one, or None to keep that one.

        Each new one is counted in ``counts``: ``specialised``, or ``failed`` (said once) where
        the re-trace raised."""
        if not self.plan.has_few_rows(args):
            return None
        from npugraph_ex.kernels.static_compile import input_signature

        signature = input_signature(args)
        if signature in self.made:
            self.made.move_to_end(signature)
            return self.made[signature]
        try:
            graph = rewritten_for(self.gm, args)
        except Exception as error:  # a re-trace may fail on any op; the symbolic graph works
            counts["failed"] += 1
            self.say_failed(error)
            graph = None
        else:
            counts["specialised"] += graph is not None
        self.made[signature] = graph
        if len(self.made) > self.kept:
            self.made.popitem(last=False)
        return graph

    def say_failed(self, error: Exception) -> None:
        log_once(
            log,
            logging.WARNING,
            ("key specialisation", id(self), type(error).__name__),
            "npugraph_ex: %s: re-tracing a key with its sizes failed (%s: %s); it captures the "
            "graph with symbolic sizes",
            self.name,
            type(error).__name__,
            first_line(error),
        )


def rewritten_for(gm: torch.fx.GraphModule, args: Sequence[Any]) -> torch.fx.GraphModule | None:
    """``gm`` re-traced on ``args``' sizes with the capture-only patterns applied, or None if
    none of them matched."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from npugraph_ex.kernels.static_compile import specialise
    from npugraph_ex.passes.patterns import (
        canonical_spellings,
        capture_registry,
        register_builtin_patterns,
    )

    fake_mode = FakeTensorMode()
    fake_args = [
        fake_mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    static_gm = specialise(gm, fake_args, fake_mode, decompositions={})
    register_builtin_patterns()
    canonical_spellings(static_gm.graph)
    if not capture_registry().apply(static_gm.graph):
        return None
    static_gm.graph.eliminate_dead_code()
    static_gm.recompile()
    return static_gm
