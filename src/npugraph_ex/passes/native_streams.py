"""PyTorch's own streams inside a compiled function, as stream blocks.

Dynamo traces ``with torch.cuda.stream(s):`` (or ``torch.npu.stream``, ``with s:``) into no op:
it notes the stream on each node traced inside (``node.meta["custom"]["stream"]``, an index into
its table of stream objects), and AOTAutograd keeps the note. Each run of nodes on one stream
other than the device's current one becomes a stream block of a tag named after the stream:

    before:  %sin = aten.sin(%x)   {"stream": 1}      %add = aten.add(%sin, 1)
    after:   scope_enter(["_user_stream_label", "_user_stream_priority"], ["cuda:0/stream3", "0"])
             %sin = aten.sin(%x);  scope_exit();      %add = aten.add(%sin, 1)

``tensor.record_stream(s)`` (``streams.record_stream``) is dropped: every tensor a block touches
is kept until the block is joined. PyTorch's events and stream-to-stream waits
(``torch.cuda.Event().record()/wait()``, ``Stream.wait_event``, ``wait_stream``,
synchronisations) become tagged events on the lanes of the streams they name, as TorchAir turns
them into its tagged events (``stream_syncs``); a stream op this does not know is refused with
the scope API to write instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import torch
import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.debug.source import source_line
from npugraph_ex.errors import ScopeError
from npugraph_ex.passes.stream_syncs import (
    LOWERED,
    is_control_deps,
    is_current,
    lower_dynamo_syncs,
    stream_op,
    unwrap_control_deps,
    wrapped_op,
)
from npugraph_ex.passes.unnest_blocks import drop_empty_parts
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT, STREAM_LABEL, STREAM_PRIORITY

INSTEAD = (
    "Write the branch as a block of npugraph_ex.scope.stream(tag) and order blocks with "
    "npugraph_ex.scope.npu_tagged_event_record / npu_tagged_event_wait (or npugraph_ex.ops.record "
    "/ wait) instead."
)


def native_streams(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config) -> None:
    """The pass: ``convert_native_streams`` on the graph."""
    convert_native_streams(gm.graph)


def convert_native_streams(graph: torch.fx.Graph) -> None:
    """Turn the graph's native stream regions into stream blocks and its synchronisations into
    tagged events (see the module)."""
    wrappers = [node for node in graph.nodes if is_control_deps(node)]
    for node in wrappers:  # they order one another: graph order does that here
        node.args = ((), *node.args[1:])
    for node in list(graph.nodes):
        if is_control_deps(node):
            node = unwrap_control_deps(node) or refuse(wrapped_op(node) or node)
        if stream_op(node) == "record_stream":
            graph.erase_node(node)
        elif stream_op(node) is not None and stream_op(node) not in LOWERED:
            refuse(node)
    made: set[torch.fx.Node] = set()
    """The block edges made here: a block a synchronisation alone filled is left empty below."""
    open_tag: str | None = None
    for node in list(graph.nodes):
        if node.op in ("placeholder", "get_attr"):
            continue
        tag, priority = side_stream(node) if node.op == "call_function" else (None, 0)
        if tag == open_tag:
            continue
        source = node.meta.get("stack_trace")
        with graph.inserting_before(node):
            if open_tag is not None:
                leave = graph.call_function(SCOPE_EXIT, ())
                leave.meta["stack_trace"] = source
                made.add(leave)
            if tag is not None:
                keys = [STREAM_LABEL, STREAM_PRIORITY]
                enter = graph.call_function(SCOPE_ENTER, (keys, [tag, str(priority)]))
                enter.meta["stack_trace"] = source
                made.add(enter)
        open_tag = tag
    lower_dynamo_syncs(graph, lambda index: traced_stream_tag(index)[0])
    drop_empty_parts(graph, made)


def refuse(node: torch.fx.Node) -> NoReturn:
    what = f"streams.{stream_op(node)}" if stream_op(node) else "a stream synchronisation"
    raise ScopeError(
        f"{what} at {source_line(node)}: PyTorch's events and stream waits "
        "(torch.cuda.Event / torch.npu.Event record and wait, Stream.wait_event, wait_stream, "
        f"synchronize) do not run inside a function compiled with npugraph_ex. {INSTEAD}"
    )


def stream_index(node: torch.fx.Node) -> int | None:
    custom = node.meta.get("custom")
    return custom.get("stream") if isinstance(custom, dict) else None


def side_stream(node: torch.fx.Node) -> tuple[str | None, int]:
    """The tag and priority of the stream a node was traced on, or None for the current one."""
    index = stream_index(node)
    return (None, 0) if index is None else traced_stream_tag(index)


def traced_stream_tag(index: int) -> tuple[str | None, int]:
    """The tag and priority of the stream Dynamo noted at ``index``, or None for the current
    one."""
    stream = traced_stream(index)
    if stream is None:
        return f"stream{index}", 0
    if is_current(stream):
        return None, 0
    return f"{stream.device}/stream{stream.stream_id}", int(getattr(stream, "priority", 0) or 0)


def traced_stream(index: int) -> Any:
    """The stream object Dynamo noted at ``index`` while it traced this graph, if still known."""
    try:
        from torch._dynamo.graph_bytecode_inputs import get_external_object_by_index

        stream = get_external_object_by_index(index)
    except (ImportError, AssertionError):  # not in Dynamo's table: the index names the stream
        return None
    return stream if isinstance(stream, torch.Stream) else None
