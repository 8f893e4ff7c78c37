"""Tensor dumps (``dump_tensor_data``): every node's outputs of chosen calls, written to disk.

Which calls: ``data_dump_calls`` (``"0|2-4"``: a graph's calls 0, 2, 3 and 4, counted from 0;
empty: every call). Which nodes: ``data_dump_nodes`` (shell patterns matched against a node's
name and its op, ``"aten.mm.*"``; empty: every node). Which graph: ``data_dump_stage``, the
``original`` graph (before the passes, run node by node) or the ``optimized`` one (the graph that
is captured: on CPU its replay is dumped after each node's kernels, elsewhere the call runs the
graph node by node). The files are described in ``dump_files``.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.debug.dump_files import (
    DumpedNode,
    DumpIndex,
    call_folder,
    dumped_output,
    file_name,
    write_index,
)
from npugraph_ex.debug.once import log_once
from npugraph_ex.debug.source import source_line
from npugraph_ex.option_checks import parse_calls

log = logging.getLogger(__name__)

ORIGIN = "npugraph_ex_origin"
"""Node meta: the name of the node of the graph before the passes that a node computes."""


def mark_origins(graph: torch.fx.Graph) -> None:
    """Name every node's origin after itself; passes that rewrite a node copy its meta, so the
    rewritten node keeps the origin, and dumps of two stages align on it."""
    for node in graph.nodes:
        node.meta.setdefault(ORIGIN, node.name)


def inherit_origins(before: torch.fx.Graph, after: torch.fx.Graph) -> None:
    """Give the nodes a pass made the origin of what they replaced, by data flow: a new node
    that a node ``u`` the pass kept reads as its k-th input takes the origin of the k-th input
    of ``u`` before the pass, unless a node of the new graph still has that origin. Only the
    outputs of a rewrite align so: the nodes inside it compute other values.

        before:  sinh, cosh -> add -> relu        after:  exp -> relu
                 exp takes add's origin (relu read add where it now reads exp)
    """
    by_origin = {n.meta[ORIGIN]: n for n in before.nodes if ORIGIN in n.meta}
    kept = {n.meta[ORIGIN] for n in after.nodes if ORIGIN in n.meta}
    taken = set(kept)
    for node in reversed(after.nodes):
        if ORIGIN in node.meta:
            continue
        for user in node.users:
            user_origin = user.meta.get(ORIGIN)
            old_user = by_origin.get(user_origin) if user_origin in kept else None
            if old_user is None:
                continue
            inputs, old_inputs = flat_inputs(user), flat_inputs(old_user)
            position = next((i for i, value in enumerate(inputs) if value is node), len(inputs))
            old = old_inputs[position] if position < len(old_inputs) else None
            origin = old.meta.get(ORIGIN) if isinstance(old, torch.fx.Node) else None
            if origin is not None and origin not in taken:
                node.meta[ORIGIN] = origin
                taken.add(origin)
                break


def flat_inputs(node: torch.fx.Node) -> list[Any]:
    """A node's arguments, flattened in order (nodes and constants)."""
    return torch.utils._pytree.tree_leaves((node.args, node.kwargs))


def op_name(node: torch.fx.Node) -> str:
    """``aten.mm.default`` for an op node; ``placeholder``, ``get_attr`` for the others."""
    if node.op != "call_function":
        return node.op
    if isinstance(node.target, torch._ops.OpOverload):
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target))


def rank() -> int:
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank()
    return 0


class TensorDumper:
    """Counts one graph's calls and makes a :class:`CallDump` for each call to dump."""

    def __init__(self, config: Config, graph: str):
        self.root = config.data_dump_dir
        self.stage = config.data_dump_stage
        self.graph = graph
        self.ranges = parse_calls(config.data_dump_calls)
        self.patterns = tuple(config.data_dump_nodes)
        self.calls = 0

    def next_call(self) -> CallDump | None:
        """The dump of the call being made, or None when it is not dumped."""
        call, self.calls = self.calls, self.calls + 1
        if self.ranges and not any(low <= call <= high for low, high in self.ranges):
            return None
        return CallDump(self, call)

    def wants(self, node: torch.fx.Node) -> bool:
        if node.op == "output":
            return False
        if not self.patterns:
            return True
        names = (node.name, op_name(node))
        return any(fnmatch.fnmatchcase(n, p) for p in self.patterns for n in names)


class CallDump:
    """The dump of one call: ``begin`` names its key and how it runs, ``visit`` writes a node's
    outputs, ``finish`` writes the index. A dump without an index is unfinished."""

    def __init__(self, dumper: TensorDumper, call: int):
        self.dumper = dumper
        self.call = call
        self.index: DumpIndex | None = None
        self.folder = None
        self.order: dict[torch.fx.Node, int] = {}

    def begin(self, key: str, how: str, graph: torch.fx.Graph) -> None:
        d = self.dumper
        self.folder = call_folder(d.root, rank(), d.graph, d.stage, key, self.call)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index = DumpIndex(d.graph, d.stage, key, self.call, how, rank())
        self.order = {node: i for i, node in enumerate(graph.nodes)}

    def visit(self, node: torch.fx.Node, value: Any) -> None:
        if self.index is None or not self.dumper.wants(node):
            return
        order = self.order.get(node, len(self.order))
        values = value if isinstance(value, (list, tuple)) else [value]
        outputs = [
            dumped_output(self.folder, file_name(order, node.name, i), v)
            for i, v in enumerate(values)
        ]
        origin = node.meta.get(ORIGIN, node.name)
        self.index.nodes.append(
            DumpedNode(order, node.name, op_name(node), source_line(node), outputs, origin)
        )

    def finish(self) -> None:
        if self.index is not None:
            self.index.nodes.sort(key=lambda n: n.order)
            write_index(self.index, self.folder)

    def run_graph(self, gm: torch.fx.GraphModule, args: Sequence[Any], key: str) -> Any:
        """Run ``gm`` node by node on ``args``, dumping every node; its outputs."""
        self.begin(key, "eager", gm.graph)
        with torch.no_grad():
            return DumpingInterpreter(gm, self).run(*args)


class DumpingInterpreter(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, dump: CallDump):
        super().__init__(gm)
        self.dump = dump

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        self.dump.visit(n, value)
        return value


def dumping_original(
    call: Callable[[list[Any]], Any], original: torch.fx.GraphModule, dumper: TensorDumper
) -> Callable[[list[Any]], Any]:
    """``call``, except that each call to dump runs ``original`` node by node, dumping it."""

    def run(args: list[Any]) -> Any:
        dump = dumper.next_call()
        if dump is None:
            return call(args)
        try:
            outputs = dump.run_graph(original, args, "eager")
            return [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
        finally:
            dump.finish()

    return run


def say_dumps_run_eagerly(graph: str, reason: str, number: int) -> None:
    """Once per compiled graph (``number``) and reason."""
    log_once(
        log,
        logging.WARNING,
        ("dump eagerly", number, reason),
        "npugraph_ex: %s: dumped calls run the graph node by node, not its replay (%s)",
        graph,
        reason,
    )
