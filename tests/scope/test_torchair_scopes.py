"""TorchAir's scope spellings: the ``scope_enter(keys, values)`` / ``scope_exit()`` ops called
directly or inserted by a pass, ``npu_stream_switch``, ``npu_wait_tensor``, ``super_kernel``."""

from __future__ import annotations

import logging

import pytest
import torch

import npugraph_ex
from helpers import THREADS_SEEN, GraphRecorder, intra_op_threads, threads_seen, totals
from npugraph_ex.errors import ScopeError
from npugraph_ex.scope import (
    data_dump,
    limit_core_num,
    npu_stream_switch,
    npu_wait_tensor,
    op_never_timeout,
    super_kernel,
)
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT, scopes_in

ENTER, EXIT = torch.ops.npugraph_ex.scope_enter, torch.ops.npugraph_ex.scope_exit


def torchair_blocks(x: torch.Tensor) -> torch.Tensor:
    """A stream block and a core limit, written with TorchAir's ops and keys."""
    ENTER(["_user_stream_label"], ["stream0"])
    y = threads_seen(x.sin())
    EXIT()
    ENTER(["_op_aicore_num", "_op_vectorcore_num"], ["1", "1"])
    y = threads_seen(y + 1)
    EXIT()
    return threads_seen(y * 2)


@torch.no_grad()
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_the_ops_called_with_torchair_keys_compile_and_apply(dynamic) -> None:
    recorder = GraphRecorder()
    compiled = torch.compile(
        torchair_blocks,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=dynamic,
        options={"post_grad_custom_post_pass": recorder},
    )
    with intra_op_threads(2):
        for _ in range(3):
            THREADS_SEEN.clear()
            x = torch.randn(6)
            assert torch.equal(compiled(x), torchair_blocks(x))
            # Each run of the graph (warm-up, capture, replay) caps the middle op alone.
            assert THREADS_SEEN and THREADS_SEEN == [2, 1, 2] * (len(THREADS_SEEN) // 3)
    assert scopes_in(recorder.graphs[0].graph) == ["stream", "limit_core_num"]


def insert_stream_block(gm: torch.fx.GraphModule, example_inputs, config) -> None:  # noqa: ANN001
    """TorchAir's documented idiom: a custom pass puts each ``sin`` in a stream block."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.target is torch.ops.aten.sin.default:
            with graph.inserting_before(node):
                graph.call_function(
                    torch.ops.npugraph_ex.scope_enter.default,
                    (["_user_stream_label"], ["stream1"]),
                )
            with graph.inserting_after(node):
                graph.call_function(torch.ops.npugraph_ex.scope_exit.default, ())
    gm.recompile()


@torch.no_grad()
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_custom_pass_may_insert_the_ops(dynamic) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.sin().cos() + 1

    recorder = GraphRecorder()
    npugraph_ex.reset_stats()
    compiled = torch.compile(
        fn,
        backend="npugraph_ex",
        dynamic=dynamic,
        options={
            "post_grad_custom_pre_pass": insert_stream_block,
            "post_grad_custom_post_pass": recorder,
        },
    )
    for _ in range(3):
        x = torch.randn(5)
        assert torch.equal(compiled(x), fn(x))
    nodes = recorder.only().nodes
    assert sum(n.target is SCOPE_ENTER for n in nodes) == 1
    assert sum(n.target is SCOPE_EXIT for n in nodes) == 1
    assert totals()["captures"] == 1 and totals()["replays"] == 2


@torch.no_grad()
def test_npu_stream_switch_and_wait_tensor_keep_results() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        a = x * 2
        with npu_stream_switch("side", 1):
            b = npu_wait_tensor(x.cos(), a)
        return npu_wait_tensor(a, b) + b

    compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
    x = torch.randn(4)
    assert torch.equal(compiled(x), fn(x))
    y = torch.randn(3)
    assert npu_wait_tensor(y, x) is y


@torch.no_grad()
def test_super_kernel_is_kept_as_a_block_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        with super_kernel("sk_warn_once", "stream-fusion=1"):
            return x.exp() + 1

    recorder = GraphRecorder()
    compiled = torch.compile(
        fn, backend="npugraph_ex", options={"post_grad_custom_post_pass": recorder}
    )
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for _ in range(3):
            x = torch.randn(4)
            assert torch.equal(compiled(x), fn(x))
    assert scopes_in(recorder.only()) == ["attributes"]
    assert caplog.text.count("are Ascend-only and do nothing on this device") == 1


@torch.no_grad()
@pytest.mark.parametrize("block", [lambda: op_never_timeout(True), data_dump])
def test_torchair_attribute_blocks_compile_as_blocks(block, caplog) -> None:  # noqa: ANN001
    def fn(x: torch.Tensor) -> torch.Tensor:
        with block():
            return x.exp() + 1

    recorder = GraphRecorder()
    compiled = torch.compile(
        fn, backend="npugraph_ex", options={"post_grad_custom_post_pass": recorder}
    )
    for _ in range(2):
        x = torch.randn(4)
        assert torch.equal(compiled(x), fn(x))
    assert scopes_in(recorder.only()) == ["attributes"]


def test_op_never_timeout_takes_a_bool() -> None:
    with pytest.raises(ScopeError, match="op_never_timeout enable must be a bool, got 'yes'"):
        op_never_timeout("yes")


@torch.no_grad()
def test_no_vector_cores_caps_at_the_other_number() -> None:
    # TorchAir's limit_core_num(n, 0): no cores of the second kind.
    def fn(x: torch.Tensor) -> torch.Tensor:
        with limit_core_num(1, 0):
            return torch.mm(x, x) + 1

    compiled = torch.compile(fn, backend="npugraph_ex")
    for _ in range(2):
        x = torch.randn(8, 8)
        torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: ENTER(["_user_stream_label", "_user_stream_priority"], ["s"]),
            "scope_enter takes one value per key, got 2 keys and 1 values: "
            "keys=['_user_stream_label', '_user_stream_priority'], values=['s']",
        ),
        (
            lambda: ENTER(["_op_aicore_num"], ["zero"]),
            "scope_enter: _op_aicore_num must be an int >= 0 (as a str), got 'zero'",
        ),
        (
            lambda: npu_wait_tensor(torch.ones(1), 3),
            "npu_wait_tensor takes two tensors (self, dependency), got Tensor and int",
        ),
    ],
    ids=["lengths", "core number", "wait on a number"],
)
def test_bad_blocks_are_refused(call, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ScopeError) as raised:
        call()
    assert str(raised.value) == message


def never_closed(x: torch.Tensor) -> torch.Tensor:
    ENTER(["_user_stream_label"], ["s0"])
    return x.sin() + 1


def closes_nothing(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    torch.ops.npugraph_ex.scope_exit()
    return y + 1


@pytest.mark.parametrize(
    ("fn", "pieces"),
    [
        (
            never_closed,
            [
                "scope_enter(['_user_stream_label'], ['s0']) at File",
                'in never_closed: ENTER(["_user_stream_label"], ["s0"]) is never closed',
                "Close it with scope_exit()",
            ],
        ),
        (
            closes_nothing,
            [
                "scope_exit at File",
                "in closes_nothing: torch.ops.npugraph_ex.scope_exit() closes no block",
            ],
        ),
    ],
)
def test_an_unbalanced_scope_is_refused_at_compile_naming_the_op_and_line(fn, pieces) -> None:  # noqa: ANN001
    # Before: a capture that recursed forever (an open block waiting on itself) and eager
    # calls after one warning; a stray scope_exit was taken silently.
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as raised:
        torch.compile(fn, backend="npugraph_ex")(torch.randn(4))
    assert isinstance(raised.value.inner_exception, ScopeError)
    for piece in pieces:
        assert piece in str(raised.value.inner_exception)
