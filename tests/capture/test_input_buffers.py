"""A key's own input buffers: made once by the device's runtime for the key's pool
(``DeviceRuntime.input_buffers``), read by every capture of the key (its ATen graph, then its
kernels), and held, with what keeps their memory, as long as the key lives. Checked here with a
runtime that records what it is asked; the CUDA test of ``tests/runtime/test_cuda_pools.py``
checks where the buffers lie on a GPU."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import npugraph_ex.compiler
from helpers import graphs_called
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.capture.manager import GLOBAL_CAPTURE_LOCK
from npugraph_ex.runtime.base import Capture, InputBuffers, Program
from npugraph_ex.runtime.cpu import CpuRuntime

SETTLE_SECONDS = 120
"""How long a key may take to be captured on its compiled kernels."""


class Hold:
    """Stands for what keeps a pool usable (a graph anchoring it, on CUDA)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool


class RecordingRuntime(CpuRuntime):
    """The CPU runtime, noting the input buffers it makes and what each capture reads."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[list[torch.Tensor], Any, InputBuffers]] = []
        self.captures: list[tuple[str, list[Any], Any, tuple[int, ...]]] = []
        self.made_under_global_lock: list[bool] = []

    def input_buffers(self, sources: Sequence[torch.Tensor], pool: Any) -> InputBuffers:
        made = InputBuffers(super().input_buffers(sources, pool).tensors, Hold(pool))
        self.made.append((list(sources), pool, made))
        self.made_under_global_lock.append(GLOBAL_CAPTURE_LOCK._is_owned())
        return made

    def capture(
        self, program: Program, args: Sequence[Any], pool: Any, owned_inputs: Sequence[int] = ()
    ) -> Capture:
        self.captures.append((program.kind, list(args), pool, tuple(owned_inputs)))
        return super().capture(program, args, pool, owned_inputs)


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> RecordingRuntime:
    recording = RecordingRuntime()
    monkeypatch.setattr(npugraph_ex.compiler, "runtime_for", lambda device_type: recording)
    return recording


def identities(tensors: Sequence[Any]) -> list[int]:
    return [id(t) for t in tensors]


def scaled_sum(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu() * scale


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(4, 8), torch.randn(8, 8), torch.randn(())


@torch.no_grad()
def test_a_keys_input_buffers_are_made_once_for_its_pool_and_captured(
    runtime: RecordingRuntime,
) -> None:
    before = live_graph_numbers()
    options = {"static_kernel_compile": False}
    fn = torch.compile(scaled_sum, backend="npugraph_ex", options=options, dynamic=False)
    first = inputs()
    torch.testing.assert_close(fn(*first), scaled_sum(*first))
    for _ in range(3):
        args = inputs()
        torch.testing.assert_close(fn(*args), scaled_sum(*args))
    (manager,) = managers_since(before)
    (entry,) = manager.entries.values()
    ((sources, pool, made),) = runtime.made
    assert identities(sources) == identities(first)
    assert pool is entry.pool
    assert identities([buffer for _, buffer in entry.staged.copies]) == identities(made.tensors)
    assert entry.staged.hold is made.hold and made.hold.pool is pool
    ((kind, captured, captured_pool, owned),) = runtime.captures
    assert (kind, captured_pool) == ("graph", pool)
    assert identities([captured[i] for i in owned]) == identities(made.tensors)
    assert all(b.data_ptr() != s.data_ptr() for b, s in zip(made.tensors, sources, strict=True))


@pytest.mark.parametrize("mode", ["global", "thread_local"])
@torch.no_grad()
def test_buffers_are_made_under_the_global_capture_lock_in_global_mode(
    runtime: RecordingRuntime, mode: str
) -> None:
    # On CUDA a pool's first buffers come with an empty capture that holds the pool, and may be
    # new device memory: either fails a capture in 'global' mode running on another thread.
    options = {"static_kernel_compile": False, "capture_error_mode": mode}
    fn = torch.compile(scaled_sum, backend="npugraph_ex", options=options, dynamic=False)
    args = inputs()
    torch.testing.assert_close(fn(*args), scaled_sum(*args))
    assert runtime.made_under_global_lock == [mode == "global"]


@torch.no_grad()
def test_a_key_without_copies_asks_for_no_buffers(runtime: RecordingRuntime) -> None:
    options = {"static_kernel_compile": False, "clone_input": False}
    fn = torch.compile(scaled_sum, backend="npugraph_ex", options=options, dynamic=False)
    args = inputs()
    torch.testing.assert_close(fn(*args), scaled_sum(*args))
    assert runtime.made == []
    ((_, captured, _, owned),) = runtime.captures
    assert owned == () and identities(captured) == identities(args)


@torch.no_grad()
def test_a_keys_buffers_and_their_hold_go_with_the_key(runtime: RecordingRuntime) -> None:
    before = live_graph_numbers()
    fn = torch.compile(scaled_sum, backend="npugraph_ex", options={"static_kernel_compile": False})
    fn(*inputs())
    ((_, _, made),) = runtime.made
    hold, buffer = weakref.ref(made.hold), weakref.ref(made.tensors[0])
    del made
    runtime.made.clear()
    runtime.captures.clear()
    (manager,) = managers_since(before)
    manager.release()
    gc.collect()
    assert hold() is None and buffer() is None


@torch.no_grad()
def test_the_kernels_captured_for_a_key_read_the_buffers_its_aten_graph_read(
    runtime: RecordingRuntime,
) -> None:
    options = {"static_kernel_compile": "background", "background_compile_after": 2}
    fn = torch.compile(scaled_sum, backend="npugraph_ex", options=options, dynamic=False)
    deadline = time.monotonic() + SETTLE_SECONDS
    while {kind for kind, *_ in runtime.captures} != {"graph", "kernels"}:
        assert time.monotonic() < deadline, graphs_called()
        args = inputs()
        torch.testing.assert_close(fn(*args), scaled_sum(*args))
        time.sleep(0.01)
    ((_, pool, made),) = runtime.made
    for kind, captured, captured_pool, owned in runtime.captures:
        assert captured_pool is pool, kind
        assert identities([captured[i] for i in owned]) == identities(made.tensors), kind
