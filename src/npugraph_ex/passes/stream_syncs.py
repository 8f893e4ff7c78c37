"""Synchronisations that name a stream, as tagged events on that stream's lane.

PyTorch's (Dynamo's ``streams`` ops, traced from ``torch.cuda.Event`` / ``torch.npu.Event``
``record`` and ``wait``, ``Stream.wait_event``, ``Stream.wait_stream`` and the
``synchronize`` calls) and TorchAir's ``*_on_stream`` ops each say which stream acts. Each
becomes the tagged events the replay orders lanes with, on that stream's lane (a stream's
lane is the tag ``native_streams`` gives its blocks; the graph's own stream is the main path):

    streams.record_event(e, s)              record "torch.Event#e" on s
    streams.wait_event(e, s)                wait for "torch.Event#e" on s
    streams.wait_stream(a, b)               record "wait_stream#n" on b, then wait for it on a
    streams.synchronize_event(e)            wait for "torch.Event#e" on the main path
    streams.synchronize_stream(s)           record "synchronize#n" on s, wait on the main path
    streams.synchronize_device(...)         the same for every stream with a block before it
    tagged_event_record_on_stream(tag, s)   record tag on s         (TorchAir's schemas:
    tagged_event_wait_on_stream(tag, s)     wait for tag on s        a stream is its id, device
    tagged_stream_wait_stream(a, b)         as wait_stream(a, b)     index and device type)

An op on a side stream that stands outside a block of that stream's tag gets a block of its own
around it; one on the main path that stands inside blocks gets them closed around it and opened
again after. AOTAutograd's ``control_deps`` wrappers, which only order the graph, are taken off:
graph order and the joins ``plan_streams`` adds order the lanes here.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from npugraph_ex.passes.stream_blocks import stream_tag
from npugraph_ex.runtime import runtime_for
from npugraph_ex.runtime.devices import DEVICES
from npugraph_ex.scope.events import (
    EVENT_RECORD,
    EVENT_WAIT,
    RECORD_ON_STREAM,
    STREAM_WAIT_STREAM,
    WAIT_ON_STREAM,
)
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT, STREAM_LABEL, STREAM_PRIORITY

STREAM_OPS = "streams"
"""The namespace of Dynamo's stream and event ops (``torch.ops.streams``)."""

Lane = str | None
"""A stream block's tag, or None for the main path (the graph's own stream)."""


def stream_op(node: torch.fx.Node) -> str | None:
    """The name of a node's op among Dynamo's stream and event ops, else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    return target._opname if target.namespace == STREAM_OPS else None


def is_control_deps(node: torch.fx.Node) -> bool:
    """Whether a node is AOTAutograd's wrapper that orders a stream synchronisation."""
    target = node.target
    return isinstance(target, torch._ops.HigherOrderOperator) and target.name() == "control_deps"


def wrapped_op(node: torch.fx.Node) -> torch.fx.Node | None:
    """The stream op in the subgraph a ``control_deps`` node runs, if it can be found."""
    getter = node.args[1] if len(node.args) > 1 else None
    module = node.graph.owning_module
    if not isinstance(getter, torch.fx.Node) or getter.op != "get_attr" or module is None:
        return None
    subgraph = getattr(module, str(getter.target), None)
    if not isinstance(subgraph, torch.fx.GraphModule):
        return None
    return next((inner for inner in subgraph.graph.nodes if stream_op(inner)), None)


def is_current(stream: Any) -> bool:
    """Whether ``stream`` is its device's current stream (the one the graph runs on)."""
    if not torch.accelerator.is_available():
        return False
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or stream.device.type != accelerator.type:
        return False
    return stream == torch.accelerator.current_stream(stream.device)


def event_tag(index: int) -> str:
    """The tag of the event Dynamo noted at ``index``."""
    return f"torch.Event#{index}"


def default_stream_of(stream: torch.Stream) -> bool:
    """Whether ``stream`` is its device's default stream, as the device's runtime says (no
    stream of a device without a runtime is)."""
    if stream.device.type not in DEVICES:
        return False
    return runtime_for(stream.device.type).default_stream(stream.stream_id)


def lane_of_named_stream(stream_id: Any, device_index: Any, device_type: Any) -> Lane:
    """The lane of the stream TorchAir's ops name by id, device index and device type (numbers,
    or their strings). A default-stream marker (not a number) or a device's stream 0 is the
    graph's own stream."""
    try:
        numbers = [int(stream_id), int(device_index), int(device_type)]
    except (TypeError, ValueError):
        return None
    stream = torch.Stream(stream_id=numbers[0], device_index=numbers[1], device_type=numbers[2])
    if is_current(stream) or default_stream_of(stream):
        return None
    return f"{stream.device}/stream{stream.stream_id}"


class Placer:
    """Puts tagged events on lanes of one graph, numbering the tags it makes up."""

    def __init__(self, graph: torch.fx.Graph):
        self.graph = graph
        self.numbers = itertools.count()

    def fresh(self, what: str) -> str:
        return f"{what}#{next(self.numbers)}"

    def place(self, at: torch.fx.Node, op: Any, tag: str, lane: Lane) -> None:
        """``op(tag)`` before ``at``, run on ``lane``; it takes ``at``'s source line."""
        opened = open_scopes(self.graph, at)
        inner = next((e for e in reversed(opened) if stream_tag(e) is not None), None)
        with self.graph.inserting_before(at):
            if lane is None:
                for _ in opened:  # every open scope closes around it, innermost first
                    self.mark(self.graph.call_function(SCOPE_EXIT, ()), at)
                self.mark(self.graph.call_function(op, (tag,)), at)
                for enter in opened:
                    self.mark(self.graph.call_function(SCOPE_ENTER, enter.args, enter.kwargs), at)
            elif inner is not None and stream_tag(inner) == lane:
                self.mark(self.graph.call_function(op, (tag,)), at)
            else:
                block = ([STREAM_LABEL, STREAM_PRIORITY], [lane, "0"])
                self.mark(self.graph.call_function(SCOPE_ENTER, block), at)
                self.mark(self.graph.call_function(op, (tag,)), at)
                self.mark(self.graph.call_function(SCOPE_EXIT, ()), at)

    def mark(self, node: torch.fx.Node, at: torch.fx.Node) -> None:
        node.meta["stack_trace"] = at.meta.get("stack_trace")

    def wait_for(self, at: torch.fx.Node, waiting: Lane, waited: list[Lane], what: str) -> None:
        """``waiting`` goes on once each of ``waited`` has issued everything before ``at``."""
        for lane in waited:
            tag = self.fresh(what)
            self.place(at, EVENT_RECORD, tag, lane)
            self.place(at, EVENT_WAIT, tag, waiting)


def open_scopes(graph: torch.fx.Graph, at: torch.fx.Node) -> list[torch.fx.Node]:
    """The ``scope_enter`` nodes still open where ``at`` stands, outermost first."""
    opened: list[torch.fx.Node] = []
    for node in graph.nodes:
        if node is at:
            return opened
        if node.target is SCOPE_ENTER:
            opened.append(node)
        elif node.target is SCOPE_EXIT and opened:
            opened.pop()
    return opened


LOWERED = (
    "record_event",
    "wait_event",
    "wait_stream",
    "synchronize_event",
    "synchronize_stream",
    "synchronize_device",
    "sync_dealloc",
)
"""Dynamo's stream ops ``lower_dynamo_syncs`` turns into tagged events."""


def lower_dynamo_syncs(graph: torch.fx.Graph, lane_of: Callable[[int], Lane]) -> None:
    """Dynamo's stream ops (see the module) as tagged events; ``lane_of(index)``: the lane of
    the stream Dynamo noted at ``index``."""
    placer = Placer(graph)
    for node in list(graph.nodes):
        name, args = stream_op(node), node.args  # by name: torch 2.11 has no synchronize_* ops
        if name == "record_event":
            placer.place(node, EVENT_RECORD, event_tag(args[0]), lane_of(args[1]))
        elif name in ("wait_event", "sync_dealloc"):
            placer.place(node, EVENT_WAIT, event_tag(args[0]), lane_of(args[1]))
        elif name == "wait_stream":
            placer.wait_for(node, lane_of(args[0]), [lane_of(args[1])], "wait_stream")
        elif name == "synchronize_event":
            placer.place(node, EVENT_WAIT, event_tag(args[0]), None)
        elif name == "synchronize_stream":
            placer.wait_for(node, None, [lane_of(args[0])], "synchronize")
        elif name == "synchronize_device":
            placer.wait_for(node, None, lanes_before(graph, node), "synchronize")
        else:
            continue
        graph.erase_node(node)


def lanes_before(graph: torch.fx.Graph, at: torch.fx.Node) -> list[Lane]:
    """The side lanes of the blocks opened before ``at``, in the order they first open."""
    seen: dict[str, None] = {}
    for node in graph.nodes:
        if node is at:
            break
        if node.target is SCOPE_ENTER and stream_tag(node) is not None:
            seen[stream_tag(node)] = None  # type: ignore[index]
    return list(seen)


def lower_on_stream_ops(graph: torch.fx.Graph) -> None:
    """TorchAir's ``*_on_stream`` ops (see the module) as tagged events."""
    placer = Placer(graph)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        args = list(node.args) + [node.kwargs[k] for k in node.kwargs if k != "created_inside"]
        if node.target is RECORD_ON_STREAM:
            placer.place(node, EVENT_RECORD, args[0], lane_of_named_stream(*args[1:4]))
        elif node.target is WAIT_ON_STREAM:
            placer.place(node, EVENT_WAIT, args[0], lane_of_named_stream(*args[1:4]))
        elif node.target is STREAM_WAIT_STREAM:
            waiting, waited = lane_of_named_stream(*args[0:3]), lane_of_named_stream(*args[3:6])
            placer.wait_for(node, waiting, [waited], "wait_stream")
        else:
            continue
        graph.erase_node(node)


def unwrap_control_deps(node: torch.fx.Node) -> torch.fx.Node | None:
    """Take AOTAutograd's ``control_deps`` wrapper off ``node``: the op it runs stands in its
    place (its users, the dependencies it passed through, read those directly). The op, or
    None where the wrapped op cannot be found."""
    inner = wrapped_op(node)
    if inner is None:
        return None
    graph = node.graph
    passed = node.args[2:]
    for user in list(node.users):
        if user.target is not operator.getitem or user.args[1] == 0:
            return None
    for user in list(node.users):
        user.replace_all_uses_with(passed[user.args[1] - 1])  # type: ignore[index]
        graph.erase_node(user)
    with graph.inserting_before(node):
        op = graph.call_function(inner.target, inner.args, inner.kwargs)
    op.meta["stack_trace"] = inner.meta.get("stack_trace") or node.meta.get("stack_trace")
    getter = node.args[1]
    graph.erase_node(node)
    if isinstance(getter, torch.fx.Node) and not getter.users:
        graph.erase_node(getter)
    return op
