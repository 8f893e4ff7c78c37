"""Scopes (``npugraph_ex.scope``): graph ops around a block, applied wherever the block runs.

A custom op records the intra-op thread count each time it really runs, so the tests see what a
kernel inside or outside a ``limit_core_num`` block gets: on capture, on every replay, in eager
code and in a graph run as is.
"""

from __future__ import annotations

import logging

import pytest
import torch

import npugraph_ex
from helpers import (
    THREADS_SEEN,
    GraphRecorder,
    graphs_called,
    intra_op_threads,
    kernels_per_replay,
    threads_seen,
    totals,
)
from npugraph_ex.errors import ScopeError
from npugraph_ex.scope import limit_core_num, npu_stream_switch, stream


def limited_middle(x: torch.Tensor) -> torch.Tensor:
    y = threads_seen(x * 2)
    with limit_core_num(1, 1):
        y = threads_seen(y.sin() + 1)
    with stream("branch"):
        y = y.cos()
    return threads_seen(y)


def threads_per_call(fn, x: torch.Tensor, calls: int) -> list[list[int]]:  # noqa: ANN001
    seen = []
    for _ in range(calls):
        THREADS_SEEN.clear()
        torch.testing.assert_close(fn(x), limited_middle(x))
        seen.append(list(THREADS_SEEN[:3]))
    return seen


@pytest.fixture
def two_threads():
    with intra_op_threads(2):
        yield


@torch.no_grad()
def test_a_replay_runs_the_block_on_fewer_threads_and_restores_them(two_threads) -> None:
    compiled = torch.compile(limited_middle, backend="npugraph_ex", fullgraph=True)
    seen = threads_per_call(compiled, torch.randn(6), calls=4)
    assert seen == [[2, 1, 2]] * 4
    assert torch.get_num_threads() == 2
    assert totals()["captures"] == 1 and totals()["replays"] == 3


@torch.no_grad()
@pytest.mark.parametrize("options", [{"force_eager": True}, {}], ids=["force_eager", "eager"])
def test_the_block_applies_outside_replays_too(two_threads, options) -> None:
    fn = (
        torch.compile(limited_middle, backend="npugraph_ex", fullgraph=True, options=options)
        if options
        else limited_middle
    )
    assert threads_per_call(fn, torch.randn(6), calls=2) == [[2, 1, 2]] * 2
    assert torch.get_num_threads() == 2


@torch.no_grad()
def test_the_cap_never_raises_the_thread_count() -> None:
    def wide(x: torch.Tensor) -> torch.Tensor:
        with limit_core_num(2, 64):
            return threads_seen(x)

    compiled = torch.compile(wide, backend="npugraph_ex", fullgraph=True)
    with intra_op_threads(1):
        THREADS_SEEN.clear()
        for _ in range(3):
            compiled(torch.randn(4))
    assert THREADS_SEEN and set(THREADS_SEEN) == {1}


@torch.no_grad()
def test_the_graph_holds_one_op_at_each_edge_of_a_block() -> None:
    recorder = GraphRecorder()
    options = {"post_grad_custom_post_pass": recorder}
    torch.compile(limited_middle, backend="npugraph_ex", fullgraph=True, options=options)(
        torch.randn(6)
    )
    order = [
        (str(n.target), n.args)
        for n in recorder.only().nodes
        if n.op == "call_function" and "scope" in str(n.target)
    ]
    assert order == [
        ("npugraph_ex.scope_enter.default", (["_op_aicore_num", "_op_vectorcore_num"], ["1", "1"])),
        ("npugraph_ex.scope_exit.default", ()),
        (
            "npugraph_ex.scope_enter.default",
            (["_user_stream_label", "_user_stream_priority"], ["branch", "0"]),
        ),
        ("npugraph_ex.scope_exit.default", ()),
    ]


@torch.no_grad()
def test_static_kernel_compile_captures_the_aten_kernels_of_a_graph_with_a_block(
    two_threads, caplog: pytest.LogCaptureFixture
) -> None:
    options = {"static_kernel_compile": True}
    compiled = torch.compile(limited_middle, backend="npugraph_ex", options=options)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        assert threads_per_call(compiled, torch.randn(6), calls=3) == [[2, 1, 2]] * 3
    assert "blocks (limit_core_num, stream), which Inductor cannot lower" in caplog.text
    (graph,) = graphs_called()
    assert graph["static_kernels"] == {"failed": 1}
    assert graph["captures"] == 1 and graph["replays"] == 2


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: limit_core_num(0, 0),
            "limit_core_num takes two ints >= 0, at least one of them >= 1 (op_aicore_num, "
            "op_vectorcore_num), got (0, 0)",
        ),
        (
            lambda: limit_core_num(True, 4),
            "limit_core_num takes two ints >= 0, at least one of them >= 1 (op_aicore_num, "
            "op_vectorcore_num), got (True, 4)",
        ),
        (lambda: stream(""), "stream tag must be a non-empty str, got '': name the branch"),
        (lambda: stream("s", 0.5), "stream priority must be an int, got 0.5 (tag='s')"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(make, message: str) -> None:
    with pytest.raises(ScopeError) as raised:
        make()
    assert str(raised.value) == message
    assert isinstance(raised.value, ValueError)


def test_torchair_spells_a_stream_npu_stream_switch() -> None:
    block = npu_stream_switch("s1", 2)
    assert block.keys == ["_user_stream_label", "_user_stream_priority", "_enable_inner_parallel"]
    assert block.values == ["s1", "2", "True"]


@torch.no_grad()
def test_a_qwen3_step_in_a_block_fuses_and_replays_as_without_it(tiny_qwen3_config) -> None:
    """The patterns apply inside a block (none spans its edges): the replay runs the same
    kernels plus the two edges and the join of the block before the output, with the same
    results (the block runs on its worker)."""
    model = tiny_qwen3_config()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])

    def in_block(input_ids: torch.Tensor) -> torch.Tensor:
        with stream("model"):
            return model(input_ids=input_ids).logits

    def plain(input_ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids).logits

    results = {}
    for name, fn in (("plain", plain), ("in_block", in_block)):
        torch._dynamo.reset()
        npugraph_ex.reset_stats()
        compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
        compiled(ids)
        results[name] = (compiled(ids), kernels_per_replay())
    (plain_logits, plain_kernels), (block_logits, block_kernels) = results.values()
    assert block_kernels == plain_kernels + 3
    assert torch.equal(block_logits, plain_logits)
    assert torch.equal(block_logits.argmax(-1), plain(ids).argmax(-1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@torch.no_grad()
def test_limit_core_num_warns_where_a_replay_cannot_apply_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    compiled = torch.compile(limited_middle, backend="npugraph_ex", fullgraph=True)
    x = torch.randn(6, device="cuda")
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for _ in range(3):
            torch.testing.assert_close(compiled(x), limited_middle(x))
    assert caplog.text.count("limit_core_num has no effect on cuda replays") == 1
