"""PyTorch's own stream APIs inside a compiled function (the pass ``native_streams``, first of
all, then ``plan_streams``): stream contexts become stream blocks, ``record_stream`` goes, events
and stream waits become tagged events on the lanes of the streams they name; TorchAir's
``*_on_stream`` ops likewise.

On a CPU-only build the stream contexts can be traced with ``torch.Stream("cpu")`` (Dynamo notes
the stream on each node as on CUDA); ``torch.cuda.Stream()`` cannot be made, and PyTorch's events
cannot be made to record on CPU at all, eager or traced: the event graphs here are written by
hand as AOTAutograd leaves them, and the CUDA tests run where CUDA is."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from helpers import GraphRecorder, counts, graphs_called
from npugraph_ex.config import Config
from npugraph_ex.errors import ScopeError
from npugraph_ex.passes.native_streams import native_streams
from npugraph_ex.passes.plan_streams import plan_streams
from npugraph_ex.passes.stream_blocks import find_lanes
from npugraph_ex.passes.stream_syncs import lane_of_named_stream
from npugraph_ex.scope.events import EVENT_RECORD, EVENT_WAIT
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT, block_of

CPU_STREAM = torch.Stream("cpu")


def in_cuda_stream_context(x):
    with torch.cuda.stream(CPU_STREAM):
        y = x.sin() * 2
    return y + x.cos()


def in_stream_context(x):
    with CPU_STREAM:
        y = x.sin() * 2
    return y + x.cos()


def in_stream_made_inside(x):
    with torch.Stream("cpu"):
        y = x.sin() * 2
    return y + x.cos()


SPELLINGS = [in_cuda_stream_context, in_stream_context, in_stream_made_inside]


def planned(gm: torch.fx.GraphModule) -> None:
    """The two stream passes, in the pipeline's order."""
    native_streams(gm, [], Config())
    plan_streams(gm, [], Config())


def lanes_after_plan(graph: torch.fx.GraphModule) -> dict[str, str]:
    planned(graph)
    graph.graph.lint()
    lanes = find_lanes(graph.graph)
    return {
        node.name: getattr(lanes.block_of[node], "tag", "main")
        for node in graph.graph.nodes
        if node.op == "call_function" and getattr(node.target, "namespace", "") == "aten"
    }


@pytest.mark.parametrize("fn", SPELLINGS, ids=lambda f: f.__name__)
def test_a_stream_context_becomes_a_stream_block(traced: Callable, fn: Callable) -> None:
    graph = traced(fn, torch.randn(4)).gm
    assert lanes_after_plan(graph) == {
        "sin": "cpu/stream0",
        "mul": "cpu/stream0",
        "cos": "main",
        "add": "main",
    }
    (enter,) = graph.graph.find_nodes(op="call_function", target=SCOPE_ENTER)
    assert block_of(enter) == (
        ["_user_stream_label", "_user_stream_priority"],
        ["cpu/stream0", "0"],
    )


@pytest.mark.parametrize("fn", SPELLINGS, ids=lambda f: f.__name__)
@torch.no_grad()
def test_a_stream_context_compiles_and_replays_eager_results(fn: Callable) -> None:
    compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
    for _ in range(3):
        x = torch.randn(32)
        assert torch.equal(compiled(x), fn(x))
    assert counts()["captures"] == 1 and counts()["replays"] == 2
    assert counts()["eager_calls"] == 0


def kept_for_a_stream(x):
    y = x.sin()
    y.record_stream(CPU_STREAM)  # no CPU kernel: eager raises NotImplementedError
    return y + 1


def test_record_stream_is_dropped(traced: Callable) -> None:
    gm = traced(lambda x: x.sin() + 1, torch.randn(4)).gm
    (sin,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.sin.default)
    with gm.graph.inserting_after(sin):  # as Dynamo traces kept_for_a_stream
        gm.graph.call_function(torch.ops.streams.record_stream.default, (sin, 0))
    planned(gm)
    assert not [n for n in gm.graph.nodes if "streams" in str(n.target)]


@torch.no_grad()
def test_record_stream_in_compiled_code_runs() -> None:
    try:  # torch 2.11's Dynamo runs the op on fake tensors, which it has no kernel for
        torch.compile(kept_for_a_stream, backend="eager", fullgraph=True)(torch.randn(8))
    except torch._dynamo.exc.Unsupported:
        pytest.skip(f"torch {torch.__version__}'s Dynamo cannot trace record_stream, any backend")
    except NotImplementedError:  # traced; run as traced, it meets the op's missing CPU kernel
        pass
    torch._dynamo.reset()
    compiled = torch.compile(kept_for_a_stream, backend="npugraph_ex", fullgraph=True)
    for _ in range(3):
        x = torch.randn(8)
        assert torch.equal(compiled(x), x.sin() + 1)
    assert counts()["replays"] == 2 and counts()["eager_calls"] == 0


def with_syncs(
    traced: Callable, ops: list[tuple[str, tuple]], wrapped: bool, traced_on: int | None = None
) -> torch.fx.GraphModule:
    """``in_cuda_stream_context``'s graph with Dynamo's stream ops ``ops`` (name, arguments)
    before its ``cos``, as traced on CUDA; ``wrapped``: in the ``control_deps`` AOTAutograd puts
    such ops in. Stream 0 is the block's (``cpu/stream0``), other indices are unknown streams;
    ``traced_on``: the stream Dynamo notes the ops were traced on, as inside ``with stream``."""
    missing = [op for op, _ in ops if not hasattr(torch.ops.streams, op)]
    if missing:
        pytest.skip(f"torch {torch.__version__} has no streams.{missing[0]}")
    gm = traced(in_cuda_stream_context, torch.randn(4)).gm
    (cos,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.cos.default)
    for op, args in ops:
        with gm.graph.inserting_before(cos):
            sync = gm.graph.call_function(getattr(torch.ops.streams, op).default, args)
        sync.meta["stack_trace"] = cos.meta["stack_trace"]
        if traced_on is not None:
            sync.meta["custom"] = {"stream": traced_on}
    if wrapped:
        streams = pytest.importorskip("torch._functorch._aot_autograd.streams")
        if not hasattr(streams, "wrap_all_sync_nodes_with_control_deps"):
            pytest.skip(f"torch {torch.__version__}'s AOTAutograd puts no control_deps in")
        streams.wrap_all_sync_nodes_with_control_deps(gm)
    return gm


def events_on_lanes(gm: torch.fx.GraphModule) -> list[tuple[str, str, str]]:
    """(record or wait, tag, lane) of each tagged event, in graph order."""
    lanes = find_lanes(gm.graph)
    return [
        (
            "record" if node.target is EVENT_RECORD else "wait",
            node.args[0],
            getattr(lanes.block_of[node], "tag", "main"),
        )
        for node in gm.graph.nodes
        if node.target in (EVENT_RECORD, EVENT_WAIT)
    ]


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "in control_deps"])
@pytest.mark.parametrize(
    ("ops", "events"),
    [
        pytest.param(
            [("record_event", (1, 0)), ("wait_event", (1, 2))],
            [("record", "torch.Event#1", "cpu/stream0"), ("wait", "torch.Event#1", "stream2")],
            id="record_event, wait_event",
        ),
        pytest.param(
            [("wait_stream", (2, 0))],
            [("record", "wait_stream#0", "cpu/stream0"), ("wait", "wait_stream#0", "stream2")],
            id="wait_stream",
        ),
        pytest.param(
            [("record_event", (1, 0)), ("synchronize_event", (1,))],
            [("record", "torch.Event#1", "cpu/stream0"), ("wait", "torch.Event#1", "main")],
            id="synchronize_event",
        ),
        pytest.param(
            [("synchronize_stream", (0,))],
            [("record", "synchronize#0", "cpu/stream0"), ("wait", "synchronize#0", "main")],
            id="synchronize_stream",
        ),
        pytest.param(
            [("synchronize_device", ("cpu", -1))],
            [("record", "synchronize#0", "cpu/stream0"), ("wait", "synchronize#0", "main")],
            id="synchronize_device",
        ),
    ],
)
def test_pytorch_s_stream_syncs_become_tagged_events_on_their_streams_lanes(
    traced: Callable, ops: list[tuple[str, tuple]], events: list, wrapped: bool
) -> None:
    gm = with_syncs(traced, ops, wrapped)
    planned(gm)
    gm.graph.lint()
    assert not [n for n in gm.graph.nodes if "streams" in str(n.target)]
    assert not [n for n in gm.graph.nodes if "control_deps" in str(n.target)]
    assert events_on_lanes(gm) == events
    (cos,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.cos.default)
    assert find_lanes(gm.graph).block_of[cos] is None  # the ops after are the main path's again


def test_a_block_a_synchronisation_alone_filled_is_not_left_empty(traced: Callable) -> None:
    # Traced inside ``with stream``, the ops get a block of their own; their waits go to the
    # main path, and the block they leave empty goes too.
    ops = [("record_event", (1, 0)), ("synchronize_event", (1,))]
    gm = with_syncs(traced, ops, wrapped=False, traced_on=0)
    planned(gm)
    assert events_on_lanes(gm) == [
        ("record", "torch.Event#1", "cpu/stream0"),
        ("wait", "torch.Event#1", "main"),
    ]
    empty = [n for n in gm.graph.nodes if n.target is SCOPE_ENTER and n.next.target is SCOPE_EXIT]
    assert empty == []


def test_a_wait_on_an_event_recorded_outside_the_graph_is_refused(traced: Callable) -> None:
    gm = with_syncs(traced, [("wait_event", (1, 0))], wrapped=False)
    with pytest.raises(ScopeError) as raised:
        planned(gm)
    assert str(raised.value).startswith("npu_tagged_event_wait on tag 'torch.Event#1' at File ")
    assert "in in_cuda_stream_context: return y + x.cos()" in str(raised.value)
    assert "inside the compiled function, before the wait" in str(raised.value)


def test_a_stream_op_not_known_is_refused_naming_the_scope_api(traced: Callable) -> None:
    gm = with_syncs(traced, [("fork", (0, 1))], wrapped=False)
    with pytest.raises(ScopeError) as raised:
        planned(gm)
    message = str(raised.value)
    assert message.startswith("streams.fork at File ")
    assert "in in_cuda_stream_context: return y + x.cos()" in message
    assert "npugraph_ex.scope.stream(tag)" in message


SIDE_LANE = ("0", "-1", "0")
"""``CPU_STREAM`` as TorchAir's ops name a stream: id, device index, device type."""
OWN = ("default", "0", "0")
"""A default-stream marker: the graph's own stream."""


CUDA_TYPE = "1"
"""CUDA's device type as TorchAir's ops name it (the number of ``c10::DeviceType::CUDA``)."""


@pytest.mark.parametrize(
    ("named", "lane"),
    [
        (("default", "0", "0"), None),
        (("0", "0", CUDA_TYPE), None),  # a GPU's stream 0: its default stream
        (("3", "0", CUDA_TYPE), "cuda:0/stream3"),
        (("0", "-1", "0"), "cpu/stream0"),  # the CPU has no default stream of that number
        (("5", "-1", "0"), "cpu/stream5"),
    ],
)
def test_a_stream_named_by_numbers_is_the_lane_its_device_s_runtime_says(
    named: tuple[str, str, str], lane: str | None
) -> None:
    assert lane_of_named_stream(*named) == lane


def with_torchair_events(x, w):
    a = x.sin()
    torch.ops.npugraph_ex.tagged_event_record_on_stream("ready", *OWN)
    with CPU_STREAM:
        torch.ops.npugraph_ex.tagged_event_wait_on_stream("ready", *SIDE_LANE)
        b = (x @ w).relu()
    torch.ops.npugraph_ex.tagged_stream_wait_stream(*OWN, *SIDE_LANE)
    return a + b


def test_torchair_s_on_stream_ops_order_the_lanes_they_name(traced: Callable) -> None:
    gm = traced(with_torchair_events, torch.randn(4, 4), torch.randn(4, 4)).gm
    planned(gm)
    assert events_on_lanes(gm) == [
        ("record", "ready", "main"),
        ("wait", "ready", "cpu/stream0"),
        ("record", "wait_stream#0", "cpu/stream0"),
        ("wait", "wait_stream#0", "main"),
    ]


@torch.no_grad()
def test_torchair_s_on_stream_ops_compile_and_replay_eager_results() -> None:
    compiled = torch.compile(with_torchair_events, backend="npugraph_ex", fullgraph=True)
    for _ in range(3):
        x, w = torch.randn(16, 16), torch.randn(16, 16)
        assert torch.equal(compiled(x, w), with_torchair_events(x, w))
    assert counts()["captures"] == 1 and counts()["replays"] == 2
    assert counts()["eager_calls"] == 0


SIDE = torch.cuda.Stream() if torch.cuda.is_available() else None
DONE = torch.cuda.Event() if torch.cuda.is_available() else None


def on_a_cuda_stream(x):
    with torch.cuda.stream(SIDE):
        y = x.sin() * 2
    return y + x.cos()


def with_cuda_events(x):
    with torch.cuda.stream(SIDE):
        y = x.sin() * 2
        DONE.record()
    DONE.wait()
    z = x.cos()
    SIDE.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(SIDE):
        w = z * 3
    torch.cuda.current_stream().wait_stream(SIDE)
    return y + z + w


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@torch.no_grad()
@pytest.mark.parametrize("fn", [on_a_cuda_stream, with_cuda_events], ids=lambda f: f.__name__)
def test_on_cuda_stream_contexts_and_events_run_as_blocks_and_tagged_events(fn: Callable) -> None:
    recorder = GraphRecorder()
    compiled = torch.compile(
        fn, backend="npugraph_ex", options={"post_grad_custom_post_pass": recorder}
    )
    for _ in range(3):
        x = torch.randn(64, device="cuda")
        torch.testing.assert_close(compiled(x), fn(x))
    assert counts()["captures"] == 1 and counts()["eager_calls"] == 0
    # Right results alone would not show the streams were seen: the same ops on one stream
    # give them too. The pass ran, and put the ops where the function put them.
    (graph,) = graphs_called()
    assert "native_streams" not in graph["failed_passes"], graph["failed_passes"]
    (gm,) = recorder.graphs
    side = f"{SIDE.device}/stream{SIDE.stream_id}"
    lanes = find_lanes(gm.graph)
    placed = {
        str(node.target): getattr(lanes.block_of[node], "tag", "main")
        for node in gm.graph.nodes
        if node.target in (torch.ops.aten.sin.default, torch.ops.aten.cos.default)
    }
    assert placed == {"aten.sin.default": side, "aten.cos.default": "main"}
    if fn is with_cuda_events:  # DONE recorded on SIDE's lane, waited for on the main path
        events = events_on_lanes(gm)
        recorded = [t for kind, t, lane in events if kind == "record" and lane == side]
        done = [t for t in recorded if t.startswith("torch.Event#")]
        assert done and ("wait", done[0], "main") in events, events
