"""Stream blocks: on the CPU replay engine a tag's blocks run on its worker thread beside the
main path, on CUDA on a side stream of the captured graph; the results are program order's."""

from __future__ import annotations

import threading

import pytest
import torch

from helpers import THREADS_SEEN, assert_same, counts, intra_op_threads, nap, threads_seen
from npugraph_ex.scope import (
    npu_create_tagged_event,
    npu_tagged_event_record,
    npu_tagged_event_wait,
    npu_wait_tensor,
    stream,
)

THREAD_NAMES: list[str] = []


@torch.library.custom_op("npugraph_ex_test::thread_name", mutates_args=())
def thread_name(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` that records the name of the thread it ran on."""
    THREAD_NAMES.append(threading.current_thread().name)
    return x.clone()


@thread_name.register_fake
def thread_name_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def side_and_main(x, w):
    with stream("side"):
        a = thread_name(x @ w)
        for _ in range(4):
            a = (a * 0.5).tanh() + x
    b = thread_name(nap(x + 1, 0.02))  # time enough for the worker to wake and take the block
    for _ in range(4):
        b = (b @ w).sigmoid() - 0.5
    return a + b, b


@torch.no_grad()
def test_a_replay_runs_the_block_on_its_worker_beside_the_main_path() -> None:
    compiled = torch.compile(side_and_main, backend="npugraph_ex", dynamic=False)
    w = torch.randn(16, 16)
    for _ in range(4):
        x = torch.randn(8, 16)
        THREAD_NAMES.clear()
        got = compiled(x, w)
        want = side_and_main(x, w)
        for actual, expected in zip(got, want, strict=True):
            assert torch.equal(actual, expected)
    # The last call was a replay: the block ran on the worker of "side", the rest on main.
    assert sorted(THREAD_NAMES[:2]) == ["MainThread", "npugraph_ex-side"]
    assert counts()["captures"] == 1 and counts()["replays"] == 3


def rewrites_input(x, w):
    with stream("side"):
        a = (x @ w).cos()
    x.mul_(2)  # waits for the block: it reads x
    return a + x


@torch.no_grad()
def test_a_write_to_an_input_the_block_reads_waits_for_the_block(device: str) -> None:
    compiled = torch.compile(rewrites_input, backend="npugraph_ex", dynamic=False)
    w = torch.randn(32, 32, device=device)
    for _ in range(4):
        x = torch.randn(32, 32, device=device)
        mine, theirs = x.clone(), x.clone()
        assert_same(compiled(mine, w), rewrites_input(theirs, w), device)
        assert_same(mine, theirs, device)
    assert counts()["eager_calls"] == 0


READY = npu_create_tagged_event("streams_ready")


def ordered_by_events(x):
    a = x.sin()
    npu_tagged_event_record(READY)
    with stream("side"):
        npu_tagged_event_wait(READY)
        b = x.cos() * 3
    c = npu_wait_tensor(a, b)
    return c + b


@torch.no_grad()
def test_events_and_wait_tensor_keep_results_of_program_order(device: str) -> None:
    compiled = torch.compile(ordered_by_events, backend="npugraph_ex", dynamic=False)
    for _ in range(3):
        x = torch.randn(64, device=device)
        assert_same(compiled(x), ordered_by_events(x), device)
    assert counts()["replays"] == 2 and counts()["eager_calls"] == 0


def counted_in_block(x):
    with stream("threads"):
        y = threads_seen(x.sin())
    return y + 1


@torch.no_grad()
def test_a_block_runs_with_the_main_path_s_intra_op_thread_count() -> None:
    compiled = torch.compile(counted_in_block, backend="npugraph_ex", dynamic=False)
    for threads in (1, 2):
        with intra_op_threads(threads):
            compiled(torch.randn(8))  # a capture per thread count (a key of its own)
            THREADS_SEEN.clear()
            compiled(torch.randn(8))
            assert THREADS_SEEN == [threads]


@pytest.mark.parametrize("disabled", [False, True], ids=["planned", "plan_streams_off"])
@torch.no_grad()
def test_without_the_plan_blocks_run_in_program_order_on_the_main_thread(disabled) -> None:
    options = {"disabled_passes": ["plan_streams"]} if disabled else {}
    compiled = torch.compile(side_and_main, backend="npugraph_ex", options=options)
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    compiled(x, w)
    THREAD_NAMES.clear()
    assert torch.equal(compiled(x, w)[0], side_and_main(x, w)[0])
    expected = ["MainThread"] * 2 if disabled else ["MainThread", "npugraph_ex-side"]
    assert sorted(THREAD_NAMES[:2]) == expected


def queued_behind_a_long_block(x):
    with stream("busy"):
        a = thread_name(nap(x, 0.05))
    with stream("busy"):
        b = thread_name(x * 2)  # queued behind the nap on the same worker
    c = nap(x, 0.01)  # meanwhile the worker takes the first block
    return (b + c) * 2 + a  # joins the second block first


@torch.no_grad()
def test_a_join_runs_a_block_no_worker_has_started() -> None:
    """The worker of "busy" naps in the first block; the main path, joining the second block
    before the worker reaches it, runs it itself, after the first (a tag keeps its order)."""
    compiled = torch.compile(queued_behind_a_long_block, backend="npugraph_ex", dynamic=False)
    x = torch.randn(8)
    compiled(x)
    THREAD_NAMES.clear()
    assert torch.equal(compiled(x), queued_behind_a_long_block(x))
    assert THREAD_NAMES[:2] == ["npugraph_ex-busy", "MainThread"]
