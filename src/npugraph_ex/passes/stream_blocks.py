"""Which lane each node of a graph runs on: the main path, or a stream block's tag.

    %e0 = scope_enter(["_user_stream_label"], ["comm"])    block 0 opens on lane "comm"
    %ar = _c10d_functional.all_reduce(%y, "sum", "0")       lane "comm"
    %x0 = scope_exit()                                      block 0 closes
    %h  = mm(%x, %w)                                        main

Blocks are numbered in the order they open; a tag's blocks share one lane (they run one after
another). A block opened inside another is a block of its own, opened from the outer one's lane:
its nodes run on its tag, and the nodes after its exit on the outer tag again (``plan_streams``
first splits such a graph into blocks side by side, ``unnest_blocks``). What a block reads and
writes is kept as storages of the nodes' fake values, so a view and its base are the same memory.
Refused here, with the fix: a ``limit_core_num`` block inside a stream block (a CPU worker cannot
cap the threads of its block alone: the count is process-wide).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from npugraph_ex.debug.source import source_line
from npugraph_ex.errors import ScopeError
from npugraph_ex.passes.graph_facts import fake_value
from npugraph_ex.schemas import argument_value, is_collective
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT, STREAM_LABEL, block_of, core_cap


def storages(node: torch.fx.Node) -> set[StorageWeakRef]:
    """The storages of the tensors a node's fake value holds."""
    return {
        StorageWeakRef(value.untyped_storage())
        for value in pytree.tree_leaves(fake_value(node))
        if isinstance(value, torch.Tensor)
    }


def is_tensor(node: torch.fx.Node) -> bool:
    return isinstance(fake_value(node), torch.Tensor)


def tensor_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes a node reads that hold tensors."""
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return [arg for arg in leaves if isinstance(arg, torch.fx.Node) and storages(arg)]


def written_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes a node writes in place (its schema's mutable arguments)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    written = []
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        written += [v for v in pytree.tree_leaves(value) if isinstance(v, torch.fx.Node)]
    return written


def collective_group(node: torch.fx.Node) -> str | None:
    """The process group a functional collective calls, or None for any other node."""
    if not is_collective(node.target):
        return None
    return str(argument_value(node, "group_name"))


@dataclass(eq=False)
class Block:
    """One stream block: its number, tag, and the memory and groups it uses."""

    index: int
    tag: str
    enter: torch.fx.Node
    opener: Block | None = None
    """The block whose lane opens this one (None: the main path)."""
    reads: set[StorageWeakRef] = field(default_factory=set)
    writes: set[StorageWeakRef] = field(default_factory=set)
    """Storages it writes in place or produces."""
    groups: set[str] = field(default_factory=set)
    touched: dict[torch.fx.Node, None] = field(default_factory=dict)
    """Every tensor node it reads or produces, in order: its join keeps them alive (tuple and
    list values are reached through their items, which are nodes too)."""

    def add(self, node: torch.fx.Node) -> None:
        read = tensor_args(node)
        self.touched.update(dict.fromkeys(a for a in read if is_tensor(a)))
        inputs = set().union(*(storages(arg) for arg in read))
        self.reads |= inputs
        for arg in written_args(node):
            self.writes |= storages(arg)
        produced = storages(node)
        if is_tensor(node):
            self.touched[node] = None
        self.writes |= produced - inputs
        group = collective_group(node)
        if group is not None:
            self.groups.add(group)


@dataclass
class Lanes:
    """The stream blocks of a graph and the block each node runs in (None: the main path)."""

    blocks: list[Block]
    block_of: dict[torch.fx.Node, Block | None]
    closes: dict[torch.fx.Node, Block]
    """The ``scope_exit`` node that closes each block."""


def has_stream_blocks(graph: torch.fx.Graph) -> bool:
    enters = graph.find_nodes(op="call_function", target=SCOPE_ENTER)
    return any(STREAM_LABEL in block_of(node)[0] for node in enters)


def stream_tag(node: torch.fx.Node) -> str | None:
    """The tag of a ``scope_enter`` node that opens a stream block, else None."""
    if node.target is not SCOPE_ENTER:
        return None
    keys, values = block_of(node)
    return values[keys.index(STREAM_LABEL)] if STREAM_LABEL in keys else None


def check_balanced(graph: torch.fx.Graph) -> None:
    """Every ``scope_enter`` closed by a ``scope_exit`` after it, and no ``scope_exit`` without
    one open (as written by hand, or by a pass that inserts the ops): else a ScopeError naming
    the op and the line it came from."""
    open_enters: list[torch.fx.Node] = []
    for node in graph.nodes:
        if node.target is SCOPE_ENTER:
            open_enters.append(node)
        elif node.target is SCOPE_EXIT:
            if not open_enters:
                raise ScopeError(
                    f"scope_exit at {source_line(node)} closes no block: no scope_enter is "
                    "open before it. Pair every scope_exit with a scope_enter before it (a "
                    "`with` block of npugraph_ex.scope pairs them)."
                )
            open_enters.pop()
    if open_enters:
        enter = open_enters[-1]
        keys, values = block_of(enter)
        raise ScopeError(
            f"scope_enter({keys!r}, {values!r}) at {source_line(enter)} is never closed: no "
            "scope_exit after it. Close it with scope_exit() (a `with` block of "
            "npugraph_ex.scope closes it for you)."
        )


def find_lanes(graph: torch.fx.Graph) -> Lanes:
    """Number the stream blocks and give every node its block (the innermost open one)."""
    blocks: list[Block] = []
    lanes: dict[torch.fx.Node, Block | None] = {}
    closes: dict[torch.fx.Node, Block] = {}
    open_scopes: list[Block | None] = []
    for node in graph.nodes:
        current = next((b for b in reversed(open_scopes) if b is not None), None)
        lanes[node] = current
        if node.target is SCOPE_ENTER:
            keys, values = block_of(node)
            if STREAM_LABEL in keys:
                tag = values[keys.index(STREAM_LABEL)]
                block = Block(len(blocks), tag, node, current)
                blocks.append(block)
                open_scopes.append(block)
                lanes[node] = block
                continue
            if current is not None and core_cap(keys, values) is not None:
                raise ScopeError(
                    f"limit_core_num at {source_line(node)} is inside stream block "
                    f"{current.tag!r} ({source_line(current.enter)}): a block runs on a worker "
                    "thread, and the thread count it would cap is process-wide. Put the "
                    "limit_core_num block around the stream block (the outermost one, where "
                    "blocks nest), or outside it."
                )
            open_scopes.append(None)
        elif node.target is SCOPE_EXIT and open_scopes:
            closed = open_scopes.pop()
            if closed is not None:
                closes[node] = closed
    return Lanes(blocks, lanes, closes)
