"""``deadlock_check``: before a graph with collectives runs, the ranks compare their collectives.

A collective completes only when every rank of its group calls it, with the same kind, size and
reduction, in the same order. Rank-dependent code (``if dist.get_rank() == 0: ...``) traced into
a graph can order them differently on two ranks: each then waits for a call the other never makes,
and the job hangs with no message. With ``deadlock_check=True`` each rank, when its graph is built
and before anything of it runs, gathers every rank's list of collectives (op, group, arguments,
shapes, source line) and compares them in order. A difference raises :class:`DeadlockRiskError`
on every rank, naming the first pair that differs.

The lists travel through the process group's store, not through a collective: the check takes no
place in the group's sequence of collectives (a rank that compiles while another runs a graph
would otherwise pair the check's gather with that graph's collective), and a rank that never
reaches the check is an error after the group's timeout, naming it, not a hang. The n-th check
of each rank meets the n-th of the others.

Stream blocks cannot reorder a rank's collectives: ``plan_streams`` joins a block before the next
collective of the same group, so the program order compared here is the order each rank issues
them in. Circular waits between stream blocks are refused for every graph when it is built
(``passes.stream_waits``); the check looks for them again in the graph as it will run (the pass
may be off).

A graph that passes gets one INFO line saying what was checked and that nothing was found:

    npugraph_ex: deadlock_check: graph[0/0]: 2 collectives in the same order on all 2 ranks:
    No deadlock risks detected
"""

from __future__ import annotations

import itertools
import logging
import pickle
from typing import Any

import torch
import torch.fx

from npugraph_ex.debug.source import source_line
from npugraph_ex.errors import DeadlockRiskError
from npugraph_ex.passes.stream_blocks import find_lanes, has_stream_blocks
from npugraph_ex.passes.stream_waits import check_event_order
from npugraph_ex.schemas import is_collective

log = logging.getLogger(__name__)

EXCHANGES = itertools.count()
"""Checks this process has made with collectives to compare (the key of each exchange)."""

Collective = tuple[str, str, str, str]
"""What must agree across ranks (op, group, other arguments, input layout), and the source."""


def collectives_of(gm: torch.fx.GraphModule) -> list[tuple[Collective, str]]:
    """The graph's collectives in program order, each with its user source line."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not is_collective(node.target):
            continue
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        others = [a for a in node.args if not isinstance(a, torch.fx.Node)]
        layout = ", ".join(describe_input(t) for t in tensors)
        group = str(others[-1]) if others else ""
        signature = (str(node.target), group, repr(others[:-1]), layout)
        found.append((signature, source_line(node)))
    return found


def describe_input(node: torch.fx.Node) -> str:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return node.name


def check_collective_order(gm: torch.fx.GraphModule, graph_name: str) -> None:
    """Compare this graph's collectives with every rank's and look for circular waits between
    its stream blocks; raise on the first risk found, else log one line saying none was."""
    import torch.distributed as dist

    checked: list[str] = []
    if has_stream_blocks(gm.graph):
        lanes = find_lanes(gm.graph)
        check_event_order(gm.graph, lanes)
        count = len(lanes.blocks)
        checked.append(f"{count} stream block{'s' * (count != 1)} without circular waits")
    mine = collectives_of(gm)
    if mine and dist.is_available() and dist.is_initialized():
        everyone = exchanged(mine, graph_name)
        rank = dist.get_rank()
        for other, theirs in enumerate(everyone):
            if other != rank and theirs != mine:
                raise DeadlockRiskError(first_difference(graph_name, rank, mine, other, theirs))
        checked.append(f"{len(mine)} collectives in the same order on all {len(everyone)} ranks")
    elif mine:
        checked.append(f"{len(mine)} collectives, no process group to compare them across")
    log.info(
        "npugraph_ex: deadlock_check: %s: %s: No deadlock risks detected",
        graph_name,
        ", ".join(checked) or "no collectives and no stream blocks",
    )


def exchanged(mine: list[Any], graph_name: str) -> list[Any]:
    """Every rank's list, this rank's included, through the default process group's store."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    prefix = f"npugraph_ex/deadlock_check/{next(EXCHANGES)}/"
    keys = [f"{prefix}{rank}" for rank in range(dist.get_world_size())]
    store.set(keys[dist.get_rank()], pickle.dumps(mine))
    try:
        store.wait(keys)
    except RuntimeError as error:  # the store's timeout: the process group's
        missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
        raise DeadlockRiskError(
            f"deadlock_check: {graph_name}: rank(s) {missing} did not reach this graph's check "
            f"within the process group's timeout ({store.timeout}): they compiled no graph "
            "with collectives at this point, or failed before it. Make every rank compile the "
            "same graphs (no rank-dependent code around the compiled function)."
        ) from error
    return [pickle.loads(store.get(key)) for key in keys]


def first_difference(
    graph_name: str, rank: int, mine: list[Any], other: int, theirs: list[Any]
) -> str:
    for index in range(max(len(mine), len(theirs))):
        a = mine[index] if index < len(mine) else None
        b = theirs[index] if index < len(theirs) else None
        if a == b:
            continue
        return (
            f"deadlock_check: {graph_name}: collective {index} differs between rank {rank} and "
            f"rank {other}: rank {rank} calls {shown(a)}, rank {other} calls {shown(b)}. Each "
            "would wait for a call the other never makes. Make every rank call the same "
            "collectives in the same order (no rank-dependent branches around them)."
        )
    return f"deadlock_check: {graph_name}: rank {rank} and rank {other} differ"


def shown(entry: Any) -> str:
    if entry is None:
        return "nothing (it has no more collectives)"
    (op, group, arguments, layout), source = entry
    return f"{op}({layout}, {arguments}, group {group}) at {source}"
