"""Stream blocks inside stream blocks: the inner block's tag holds until its exit, then the outer
one's again, as TorchAir nests them; the results are eager's."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import counts, nap
from npugraph_ex.config import Config
from npugraph_ex.passes.plan_streams import plan_streams
from npugraph_ex.passes.stream_blocks import find_lanes
from npugraph_ex.runtime.cuda import SideStreams
from npugraph_ex.scope import npu_stream_switch, stream
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT
from npugraph_ex.scope.router import routing

SEEN: dict[str, str] = {}
"""Label -> where the op carrying it last ran (a thread's name, or a fake stream's)."""

WHERE = threading.local()
"""``WHERE.stream``: the fake stream a router made current on this thread, if any."""


@torch.library.custom_op("npugraph_ex_test::lane_seen", mutates_args=())
def lane_seen(x: torch.Tensor, label: str) -> torch.Tensor:
    """A copy of ``x`` that notes where it ran under ``label``."""
    SEEN[label] = getattr(WHERE, "stream", None) or threading.current_thread().name
    return x.clone()


@lane_seen.register_fake
def lane_seen_fake(x: torch.Tensor, label: str) -> torch.Tensor:
    return torch.empty_like(x)


def nested_blocks(x, w):
    with stream("outer"):
        a = lane_seen((x @ w).tanh(), "outer before")
        with stream("inner", 1):
            b = lane_seen((a @ w).sigmoid(), "inner")  # waits for the outer block's first part
        c = lane_seen(b * a + x, "outer after")  # waits for the inner block
    m = lane_seen(x - 1, "main")
    return c @ w + m, b


def torchair_nested(x, w):
    with npu_stream_switch("outer"):
        a = (x @ w).tanh()
        with npu_stream_switch("inner", 1, enable_inner_parallel=False):
            b = (a @ w).sigmoid()
            with npu_stream_switch("innermost"):
                d = (x * 3).exp()
            b = b + d
        c = b * a + x
    return c @ w + x, b


@pytest.mark.parametrize("fn", [nested_blocks, torchair_nested], ids=["scope", "torchair"])
@torch.no_grad()
def test_nested_blocks_compile_and_replay_with_eager_results(fn: Callable) -> None:
    compiled = torch.compile(fn, backend="npugraph_ex", dynamic=False)
    w = torch.randn(16, 16) / 4
    for _ in range(4):
        x = torch.randn(8, 16)
        got = compiled(x, w)
        want = fn(x, w)
        for actual, expected in zip(got, want, strict=True):
            assert torch.equal(actual, expected)
    assert counts()["captures"] == 1 and counts()["replays"] == 3
    assert counts()["eager_calls"] == 0


def side_by_side_lanes(x):
    with stream("outer"):
        a = lane_seen(x.tanh(), "outer before")
        with stream("inner"):
            b = lane_seen(x.sigmoid(), "inner")
        c = lane_seen(a + x, "outer after")
    m = lane_seen(nap(x - 1, 0.05), "main")  # time for both workers to take their blocks
    return c + b + m


@torch.no_grad()
def test_a_replay_runs_the_inner_block_on_its_worker_and_the_rest_on_the_outer_one() -> None:
    compiled = torch.compile(side_by_side_lanes, backend="npugraph_ex", dynamic=False)
    x = torch.randn(64)
    compiled(x)  # the capture
    SEEN.clear()
    got = compiled(x)
    seen = dict(SEEN)
    assert torch.equal(got, side_by_side_lanes(x))
    assert seen == {
        "outer before": "npugraph_ex-outer",
        "inner": "npugraph_ex-inner",
        "outer after": "npugraph_ex-outer",
        "main": "MainThread",
    }


def wrap_nested(gm: torch.fx.GraphModule, example_inputs: object, config: object) -> None:
    """As TorchAir's custom-pass recipes do: ``mm`` .. ``exp`` on stream "outer", and inside it
    ``cos`` alone on stream "inner"."""
    graph = gm.graph
    (mm,) = graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default)
    (cos,) = graph.find_nodes(op="call_function", target=torch.ops.aten.cos.default)
    (exp,) = graph.find_nodes(op="call_function", target=torch.ops.aten.exp.default)
    enter, leave = (
        torch.ops.npugraph_ex.scope_enter.default,
        torch.ops.npugraph_ex.scope_exit.default,
    )
    with graph.inserting_before(mm):
        graph.call_function(enter, (["_user_stream_label"], ["outer"]))
    with graph.inserting_before(cos):
        graph.call_function(
            enter, (["_user_stream_label", "_user_stream_priority"], ["inner", "1"])
        )
    with graph.inserting_after(cos):
        graph.call_function(leave, ())
    with graph.inserting_after(exp):
        graph.call_function(leave, ())
    gm.recompile()


def passed_through(x, w):
    a = (x @ w).sin()
    b = a.cos()
    c = (b * a).exp()
    return c + x.neg()


@torch.no_grad()
def test_a_custom_pass_may_nest_the_scope_ops() -> None:
    tags: dict[str, str] = {}

    def lanes_after_the_pass(
        gm: torch.fx.GraphModule, example_inputs: object, config: object
    ) -> None:
        lanes = find_lanes(gm.graph)
        for node in gm.graph.nodes:
            if node.op == "call_function" and str(node.target).startswith("aten."):
                block = lanes.block_of[node]
                tags[str(node.target).split(".")[1]] = "main" if block is None else block.tag

    options = {
        "post_grad_custom_pre_pass": wrap_nested,
        "post_grad_custom_post_pass": lanes_after_the_pass,
    }
    compiled = torch.compile(passed_through, backend="npugraph_ex", options=options)
    w = torch.randn(6, 6)
    for _ in range(3):
        x = torch.randn(4, 6)
        assert torch.equal(compiled(x, w), passed_through(x, w))
    assert counts()["replays"] == 2 and counts()["eager_calls"] == 0
    assert tags == {
        "mm": "outer",
        "sin": "outer",
        "cos": "inner",
        "mul": "outer",
        "exp": "outer",
        "neg": "main",
        "add": "main",
    }


class FakeStream:
    """A stream of ``FakeDevice``: a name; its waits have nothing to wait for (ops run at once)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def wait_stream(self, other: FakeStream) -> None:
        pass

    def wait_event(self, event: object) -> None:
        pass

    def record_event(self) -> object:
        return object()


class FakeDevice:
    """The few calls of ``torch.cuda`` a router makes, with ops running at once on the host."""

    def __init__(self) -> None:
        self.made = 0
        self.set_stream(FakeStream("main"))

    def Stream(self, priority: int = 0) -> FakeStream:  # noqa: N802
        self.made += 1
        return FakeStream(f"side{self.made}")

    def current_stream(self) -> FakeStream:
        return self.current

    def set_stream(self, stream: FakeStream) -> None:
        self.current = stream
        WHERE.stream = stream.name


def planned(fn: Callable, *args: torch.Tensor) -> torch.fx.GraphModule:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    plan_streams(gm, list(args), Config())
    gm.recompile()
    return gm


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "planned graph"])
@torch.no_grad()
def test_the_router_puts_nested_blocks_on_their_streams(graph: bool) -> None:
    x, w = torch.randn(8, 16), torch.randn(16, 16) / 4
    run = planned(nested_blocks, x, w) if graph else nested_blocks
    if graph:
        enters = run.graph.find_nodes(op="call_function", target=SCOPE_ENTER)
        exits = run.graph.find_nodes(op="call_function", target=SCOPE_EXIT)
        assert len(enters) == len(exits) == 3  # outer, inner, outer again
    device, streams = FakeDevice(), {}
    SEEN.clear()
    try:
        with routing(SideStreams(device, streams)):
            got = run(x, w)
    finally:
        WHERE.stream = None
    outer, inner = streams["outer"].name, streams["inner"].name
    assert SEEN == {"outer before": outer, "inner": inner, "outer after": outer, "main": "main"}
    assert device.current.name == "main"
    for actual, expected in zip(got, nested_blocks(x, w), strict=True):
        assert torch.equal(actual, expected)
