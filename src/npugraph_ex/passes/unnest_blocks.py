"""Turn stream blocks opened inside other stream blocks into blocks side by side.

A block opened inside another runs on its own tag until its exit; the outer tag then goes on.
Split at the inner block's edges, the outer block becomes two blocks of its tag (one lane: they
still run one after the other), and every block is opened from the main path:

    before:  enter(a); x; enter(b); y; exit(); z; exit()
    after:   enter(a); x; exit(); enter(b); y; exit(); enter(a); z; exit()

Each lane runs the same nodes in the same order as before; what the inner block needs from the
outer one's first part (a value, a write, an event) is a wait ``plan_streams`` puts there, as for
any two blocks. Other scopes open inside the outer block (Ascend attribute blocks) are closed and
opened again around the inner block, so they still hold every node they held, and scopes stay
nested on the host: each exit closes the latest scope still open. The copies of ``scope_enter``
keep the original's arguments and source line. A part left with nothing inside (a block that
opens with, or ends with, its inner block) is dropped.
"""

from __future__ import annotations

import torch.fx

from npugraph_ex.passes.stream_blocks import stream_tag
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT

Node = torch.fx.Node


def unnest_blocks(graph: torch.fx.Graph) -> None:
    """Rewrite ``graph`` so that no stream block opens inside another (see the module)."""
    made: set[Node] = set()
    open_enters: list[Node] = []
    """The ``scope_enter`` nodes open at this point of the rewritten graph, outermost first."""
    reopen: dict[Node, list[Node]] = {}
    """For an inner block's enter: the scopes its exit opens again."""
    for node in list(graph.nodes):
        if node.target is SCOPE_ENTER:
            outer = innermost_stream(open_enters)
            if outer is not None and stream_tag(node) is not None:
                closed = open_enters[outer:]
                open_enters[outer:] = switch_scopes(
                    graph, node, node, closed, closed[1:], reopen, made
                )
                reopen[node] = closed
            open_enters.append(node)
        elif node.target is SCOPE_EXIT and open_enters:
            closed = reopen.pop(open_enters.pop(), None)
            if closed is None:
                continue
            kept = len(closed) - 1  # the scopes opened again inside the outer block
            start = len(open_enters) - kept
            open_enters[start:] = switch_scopes(
                graph, node.next, node, open_enters[start:], closed, reopen, made
            )
    drop_empty_parts(graph, made)


def innermost_stream(open_enters: list[Node]) -> int | None:
    """The position of the innermost open stream block among ``open_enters``, if any."""
    for position in range(len(open_enters) - 1, -1, -1):
        if stream_tag(open_enters[position]) is not None:
            return position
    return None


def switch_scopes(
    graph: torch.fx.Graph,
    before: Node,
    cause: Node,
    closed: list[Node],
    opened: list[Node],
    reopen: dict[Node, list[Node]],
    made: set[Node],
) -> list[Node]:
    """Before ``before``, exit the scopes of ``closed`` and enter copies of ``opened`` (outermost
    first); the exits carry the source line of ``cause``. Returns the copies, which take over what
    their originals open again."""
    source = cause.meta.get("stack_trace")
    copies = []
    with graph.inserting_before(before):
        for _ in closed:
            leave = graph.call_function(SCOPE_EXIT, ())
            leave.meta["stack_trace"] = source
            made.add(leave)
        for enter in opened:
            copy = graph.call_function(SCOPE_ENTER, enter.args, dict(enter.kwargs))
            copy.meta["stack_trace"] = enter.meta.get("stack_trace")
            if enter in reopen:
                reopen[copy] = reopen.pop(enter)
            copies.append(copy)
    made.update(copies)
    return copies


def drop_empty_parts(graph: torch.fx.Graph, made: set[Node]) -> None:
    """Erase each ``scope_enter`` directly followed by its ``scope_exit`` where the rewrite made
    either of the two (the user's own empty blocks stay)."""
    while True:
        empty = next(
            (
                node
                for node in graph.nodes
                if node.target is SCOPE_ENTER
                and node.next.target is SCOPE_EXIT
                and (node in made or node.next in made)
            ),
            None,
        )
        if empty is None:
            return
        graph.erase_node(empty.next)
        graph.erase_node(empty)
