"""Keys of a graph with symbolic sizes get the few-row split, decided on their own sizes.

A graph compiled with ``dynamic=True`` holds symbolic sizes, so ``pattern_fusion_pass`` cannot
split a product of few rows over the threads (``passes/patterns/row_products.py``): it needs the
row count. Every captured key has concrete sizes. Where the platform of the graph's device picks
keys by their row counts (``Platform.key_rule``; the CPU's: a product of at most
``SPLIT_MAX_ROWS`` rows, or, in a graph that gives oneDNN some of its products, a count oneDNN is
not given, ``runtime/cpu/platform.py``) and the graph's symbolic row counts (``RowPlan``, read
once from its fake values; the compile cache stores it) give a key such a product, the key's
capture runs the graph under ``SplitFewRows``, a dispatch mode that runs each ``mm``/``addmm``
the pattern would take as the pattern's replacement does, judged on the real arguments, so the
recorder records the split's kernels:

    graph:     %y = mm(%x, t(%w))                           x: [s0, 256]
    key s0=4:  bmm(view(w, [2, N/2, 256]), ...), copy       the split, as a static graph has it
    key s0=20: mm                                           the graph as it is, no mode

A product the graph runs through oneDNN's linear (``onednn_linear``, which takes symbolic row
counts) runs the same way: as the split where the split takes it, as ``mm`` where the platform
does not give oneDNN the key's row count (such keys get the mode too), as it is otherwise.

A batch or sequence that grows one row at a time (a generation loop without a KV cache, a decode
step over a dynamic batch) gets the kernels a graph compiled for one shape has for its few-row
keys, for a few milliseconds per capture (the mode's Python call per op). ``force_eager`` runs
the graph the same way for each call's sizes, so it stays the reference of what a replay
computes; the other eager calls (past ``capture_limit``, after a failed capture) run it as it
is. A split that raises leaves that product whole (counted in ``stats()`` as
``key_specialisation["failed"]``, said once at WARNING). Graphs with ``limit_core_num`` blocks
are left alone: a product's block is not known at dispatch.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode

from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import first_line
from npugraph_ex.passes.graph_facts import fake_value
from npugraph_ex.passes.patterns.onednn_linear import LINEAR, plain_or_split
from npugraph_ex.passes.patterns.row_products import split_of
from npugraph_ex.runtime.platform import KeyRule

log = logging.getLogger(__name__)

PRODUCTS = tuple(
    op for op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, LINEAR) if op is not None
)
"""The products the split takes (``mm(x, w.t())``, ``addmm(b, x, w.t())``), and oneDNN's linear,
which ``onednn_linear`` puts in place of such products where their row count is symbolic."""


@dataclass(frozen=True)
class RowPlan:
    """How to read a graph's symbolic product row counts from a call's inputs: plain data, read
    once from the fake values after the passes (the compile cache stores it with the graph,
    which it keeps without them)."""

    rows: tuple[str, ...]
    """Each distinct symbolic row count, as a sympy expression's text."""
    sources: tuple[tuple[str, int, int | None], ...]
    """Per symbol: its name, the input it is read from, and the dim (None: the int input)."""
    onednn: bool = True
    """Whether one of those products is oneDNN's linear, which a key runs as ``mm`` where oneDNN
    is not given its count (True in a plan stored before the field: the rule then assumes so)."""

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> RowPlan | None:
        """The plan of ``gm`` (from its nodes' fake values), or None if no product of it has
        a symbolic row count."""
        products = symbolic_products(gm)
        if not products:
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
        rows = dict.fromkeys(expr for expr, _ in products)
        onednn = any(op is LINEAR for _, op in products)
        return cls(tuple(str(expr) for expr in rows), tuple(sources.values()), onednn)

    def counts(self, args: Sequence[Any]) -> list[int | None]:
        """Each row count for ``args`` (None where a symbol of it has no source)."""
        bound: dict[str, int] = {}
        for name, index, dim in self.sources:
            arg = args[index] if index < len(args) else None
            if dim is None and isinstance(arg, int):
                bound[name] = arg
            elif dim is not None and isinstance(arg, torch.Tensor) and dim < arg.dim():
                bound[name] = arg.shape[dim]
        return [evaluate(expr, bound) for expr in self.rows]


def symbolic_products(gm: torch.fx.GraphModule) -> list[tuple[sympy.Expr, Any]]:
    """The matrix products of ``gm`` whose row count is symbolic: each one's count and op."""
    products = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in PRODUCTS:
            continue
        left = node.args[1] if node.target is torch.ops.aten.addmm.default else node.args[0]
        value = fake_value(left) if isinstance(left, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            continue
        count = value.shape[0]
        if isinstance(count, torch.SymInt):
            products.append((count.node.expr, node.target))
    return products


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


class SplitFewRows(TorchDispatchMode):
    """Runs ATen ops as they come, but a ``mm``/``addmm`` that the few-row split takes, judged on
    its real arguments, runs split (``row_products.split_of``). Entered inside a capture's
    recording mode, the recorder sees the split's kernels in place of the product."""

    supports_higher_order_operators = True

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.split = 0
        self.failed = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        split = None
        if not kwargs and func in PRODUCTS:
            split = plain_or_split(func, args) if func is LINEAR else split_of(func, args)
        if split is not None:
            try:
                result = split()
            except Exception as error:  # the product itself still runs
                self.failed += 1
                say_failed(self.name, error)
            else:
                self.split += 1
                return result
        return func(*args, **kwargs)


def say_failed(name: str, error: Exception) -> None:
    log_once(
        log,
        logging.WARNING,
        ("few-row split at capture", name, type(error).__name__),
        "npugraph_ex: %s: splitting a few-row product of a key failed (%s: %s); it runs as "
        "one product",
        name,
        type(error).__name__,
        first_line(error),
    )


class KeySpecialiser:
    """Per call of one graph with symbolic product row counts: the graph with its few-row
    products split, where ``rule`` (its platform's ``key_rule``) picks the call's row counts."""

    def __init__(self, fn: Callable[..., Any], plan: RowPlan, name: str, rule: KeyRule):
        self.fn = fn
        self.plan = plan
        self.name = name
        self.rule = rule

    def graph_for(self, args: Sequence[Any], counts: Counter) -> Callable[..., Any] | None:
        """What to run for ``args`` in place of the graph, or None to run it as it is."""
        if not self.rule(self.plan.counts(args), self.plan.onednn):
            return None
        return SplitRun(self.fn, self.name, counts)


class SplitRun:
    """The graph run under ``SplitFewRows``. Counted once in ``counts`` (a capture runs it for
    its warm-up too): ``specialised`` where it split a product, ``failed`` where a split
    raised (that product ran whole)."""

    def __init__(self, fn: Callable[..., Any], name: str, counts: Counter):
        self.fn = fn
        self.name = name
        self.counts = counts
        self.counted = False

    def __call__(self, *inputs: Any) -> Any:
        mode = SplitFewRows(self.name)
        with mode:
            result = self.fn(*inputs)
        outcome = "failed" if mode.failed else "specialised" if mode.split else None
        if outcome is not None and not self.counted:
            self.counts[outcome] += 1
            self.counted = True
        return result
