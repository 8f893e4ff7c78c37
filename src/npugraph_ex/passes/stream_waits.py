"""Tagged-event waits that could never be met, found before anything runs.

A wait refers to the latest record of its tag issued before it (``torch.cuda.Event`` semantics),
so a wait with no record before it waits for nothing on a GPU (a race) and would have to wait
for the future elsewhere. Graphs written for engines that match a wait with a *later* record
(TorchAir's Ascend graphs do) can then wait in a circle:

    with stream("a"): wait(ev_b); ...; record(ev_a)      a waits for b's record,
    with stream("b"): wait(ev_a); ...; record(ev_b)      b waits for a's: neither starts

Both are refused when the graph is built. The happens-before graph has an edge along each lane's
program order, from each lane into each block it opens, and from each record to the waits
matched with it (the earlier record, else the later one); a circle through a wait's edge is a
deadlock, raised as ``DeadlockRiskError`` naming every wait and record on it with its source
line. A wait that is only late (no circle) is a ``ScopeError`` naming the tag and line.
"""

from __future__ import annotations

from collections import deque

import torch.fx

from npugraph_ex.debug.source import source_line
from npugraph_ex.errors import DeadlockRiskError, ScopeError
from npugraph_ex.passes.stream_blocks import Block, Lanes
from npugraph_ex.scope.events import EVENT_RECORD, EVENT_WAIT

Edges = dict[torch.fx.Node, list[torch.fx.Node]]


def lane_name(block: Block | None) -> str:
    return "the main path" if block is None else f"stream {block.tag!r}"


def tag_of(node: torch.fx.Node) -> str:
    return str(node.args[0] if node.args else node.kwargs["tag"])


def order_edges(graph: torch.fx.Graph, lanes: Lanes) -> Edges:
    """Program order along each lane, and from the lane that opens a block into the block."""
    edges: Edges = {}
    last: dict[str | None, torch.fx.Node] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        block = lanes.block_of[node]
        lane = None if block is None else block.tag
        if block is not None and node is block.enter:
            opener = None if block.opener is None else block.opener.tag
            if opener in last:
                edges.setdefault(last[opener], []).append(node)
        if lane in last:
            edges.setdefault(last[lane], []).append(node)
        last[lane] = node
    return edges


def check_event_order(graph: torch.fx.Graph, lanes: Lanes) -> None:
    """Refuse circular waits and waits with no record before them."""
    records = {}
    for node in graph.find_nodes(op="call_function", target=EVENT_RECORD):
        records.setdefault(tag_of(node), []).append(node)
    order = {node: index for index, node in enumerate(graph.nodes)}
    edges = order_edges(graph, lanes)
    late: list[tuple[torch.fx.Node, torch.fx.Node]] = []
    for wait in graph.find_nodes(op="call_function", target=EVENT_WAIT):
        tag = tag_of(wait)
        if tag not in records:
            raise ScopeError(
                f"npu_tagged_event_wait on tag {tag!r} at {source_line(wait)}: the tag is never "
                "recorded in this graph. Record it (npu_tagged_event_record, or the event's "
                "record()) inside the compiled function, before the wait."
            )
        earlier = [r for r in records[tag] if order[r] < order[wait]]
        record = earlier[-1] if earlier else records[tag][0]
        edges.setdefault(record, []).append(wait)
        if not earlier:
            late.append((wait, record))
    for wait, record in late:
        circle = path(edges, wait, record)
        if circle is not None:
            raise DeadlockRiskError(describe_circle(circle, lanes))
    for wait, record in late:
        raise ScopeError(
            f"npu_tagged_event_wait on tag {tag_of(wait)!r} at {source_line(wait)} has no record "
            f"of the tag before it; its record at {source_line(record)} comes after it. A wait "
            "refers to the latest record issued before it: record the event first."
        )


def path(edges: Edges, start: torch.fx.Node, goal: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes of a shortest path from ``start`` to ``goal``, or None."""
    parents: dict[torch.fx.Node, torch.fx.Node | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node is goal:
            found = [node]
            while parents[found[-1]] is not None:
                found.append(parents[found[-1]])
            return found[::-1]
        for successor in edges.get(node, ()):
            if successor not in parents:
                parents[successor] = node
                queue.append(successor)
    return None


def describe_circle(circle: list[torch.fx.Node], lanes: Lanes) -> str:
    """Each wait on the circle with the record it waits for (the circle closes record -> wait)."""
    steps = list(zip(circle, circle[1:] + circle[:1], strict=True))
    pairs = [
        (wait, record)
        for record, wait in steps
        if record.target is EVENT_RECORD and wait.target is EVENT_WAIT
    ]
    lines = [
        f"  {lane_name(lanes.block_of[wait])} waits for {tag_of(wait)!r} at {source_line(wait)}, "
        f"recorded by {lane_name(lanes.block_of[record])} at {source_line(record)}"
        for wait, record in pairs
    ]
    return (
        "stream blocks wait on each other and would never finish:\n"
        + "\n".join(lines)
        + "\nRecord each event before the block that waits on it."
    )
