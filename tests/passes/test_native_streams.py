"""PyTorch's own stream APIs inside a compiled function (the pass ``native_streams``, first of
all, then ``plan_streams``): stream contexts become stream blocks, ``record_stream`` goes, events
are refused with the scope API to use instead.

On a CPU-only build the stream contexts can be traced with ``torch.Stream("cpu")`` (Dynamo notes
the stream on each node as on CUDA); ``torch.cuda.Stream()`` cannot be made, and PyTorch's events
cannot be made to record on CPU at all, eager or traced: the event graphs here are written by
hand as AOTAutograd leaves them, and the CUDA tests run where CUDA is."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from helpers import counts
from npugraph_ex.config import Config
from npugraph_ex.errors import ScopeError
from npugraph_ex.passes.native_streams import native_streams
from npugraph_ex.passes.plan_streams import plan_streams
from npugraph_ex.passes.stream_blocks import find_lanes
from npugraph_ex.scope.ops import SCOPE_ENTER, block_of

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
    compiled = torch.compile(kept_for_a_stream, backend="npugraph_ex", fullgraph=True)
    for _ in range(3):
        x = torch.randn(8)
        assert torch.equal(compiled(x), x.sin() + 1)
    assert counts()["replays"] == 2 and counts()["eager_calls"] == 0


def with_an_event(traced: Callable, op: str, wrapped: bool) -> torch.fx.GraphModule:
    """A graph with one of Dynamo's event ops before its ``cos``, as traced on CUDA; ``wrapped``:
    in the ``control_deps`` AOTAutograd puts such ops in."""
    from torch._functorch._aot_autograd.streams import wrap_all_sync_nodes_with_control_deps

    gm = traced(in_cuda_stream_context, torch.randn(4)).gm
    (cos,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.cos.default)
    args = {"wait_event": (1, 0), "record_event": (1, 0), "wait_stream": (0, 1)}[op]
    with gm.graph.inserting_before(cos):
        event = gm.graph.call_function(getattr(torch.ops.streams, op).default, args)
    event.meta["stack_trace"] = cos.meta["stack_trace"]
    if wrapped:
        wrap_all_sync_nodes_with_control_deps(gm)
    return gm


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "in control_deps"])
@pytest.mark.parametrize("op", ["wait_event", "record_event", "wait_stream"])
def test_pytorch_s_events_are_refused_naming_the_scope_api(
    traced: Callable, op: str, wrapped: bool
) -> None:
    gm = with_an_event(traced, op, wrapped)
    with pytest.raises(ScopeError) as raised:
        planned(gm)
    message = str(raised.value)
    assert message.startswith(f"streams.{op} at File ")
    assert "in in_cuda_stream_context: return y + x.cos()" in message
    assert "do not run inside a function compiled with npugraph_ex" in message
    assert "npugraph_ex.scope.stream(tag)" in message
    assert "npu_tagged_event_record / npu_tagged_event_wait" in message


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
    return y + x.cos()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@torch.no_grad()
def test_on_cuda_a_stream_context_runs_as_a_block_and_events_are_refused() -> None:
    x = torch.randn(64, device="cuda")
    compiled = torch.compile(on_a_cuda_stream, backend="npugraph_ex")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), on_a_cuda_stream(x))
    assert counts()["captures"] == 1 and counts()["eager_calls"] == 0
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"npugraph_ex\.scope\.stream\(tag\)"):
        torch.compile(with_cuda_events, backend="npugraph_ex")(x)
