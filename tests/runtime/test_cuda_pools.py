"""CUDA graph pools (``runtime.cuda_pools``): pool bytes from the allocator's segments, and the
graph's own input buffers allocated once, in its pool."""

from __future__ import annotations

import pytest
import torch

import npugraph_ex.compiler
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.runtime.base import InputBuffers
from npugraph_ex.runtime.cuda_pools import can_allocate_in_pool, pool_bytes

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")


def segment(pool: tuple[int, int], total: int, allocated: int, address: int = 0) -> dict:
    """One segment as ``torch.cuda.memory_snapshot()`` lists it (the fields read here)."""
    return {
        "segment_pool_id": pool,
        "total_size": total,
        "allocated_size": allocated,
        "address": address,
    }


def test_pool_bytes_are_the_pools_own_segments() -> None:
    segments = [
        segment((0, 0), 20 << 20, 1 << 20),  # the default pool
        segment((0, 3), 2 << 20, 512),
        segment((0, 3), 20 << 20, 4 << 20),
        segment((0, 4), 2 << 20, 2 << 20),  # another graph's pool
    ]
    assert pool_bytes(segments, (0, 3)) == (22 << 20, (4 << 20) + 512)
    assert pool_bytes(segments, (0, 9)) == (0, 0)


def test_allocations_go_to_a_pool_only_where_cuda_is() -> None:
    import torch.cuda.memory  # noqa: F401  (defines placeholders of the bindings without CUDA)

    assert can_allocate_in_pool() == torch.cuda.is_available()


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("reuse", [True, False], ids=["shared-pool", "pool-per-key"])
@torch.no_grad()
def test_input_buffers_are_allocated_once_in_the_graphs_pool_and_counted(
    reuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from npugraph_ex.runtime.cuda import CudaRuntime

    def double_then_sum(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(0)

    made: list[tuple[InputBuffers, list[int]]] = []

    class Recording(CudaRuntime):
        def input_buffers(self, sources, pool):  # noqa: ANN001, ANN202
            buffers = super().input_buffers(sources, pool)
            made.append((buffers, [b.data_ptr() for b in buffers.tensors]))
            return buffers

    recording = Recording()
    monkeypatch.setattr(npugraph_ex.compiler, "runtime_for", lambda device_type: recording)
    before = live_graph_numbers()
    options = {"reuse_graph_pool_in_same_fx": reuse}
    fn = torch.compile(double_then_sum, backend="npugraph_ex", fullgraph=True, options=options)
    x = torch.randn(256, 1024, device="cuda")
    for _ in range(3):
        assert torch.equal(fn(x), double_then_sum(x))
    (manager,) = managers_since(before)
    (entry,) = manager.entries.values()
    ((_, buffer),) = entry.staged.copies
    ((buffers, addresses),) = made  # one key, its buffers made once
    assert buffers.tensors[0] is buffer and entry.staged.hold is buffers.hold is not None
    address = buffer.data_ptr()
    assert addresses == [address]  # where it was made: never moved
    pool = [s for s in torch.cuda.memory_snapshot() if s["segment_pool_id"] == tuple(entry.pool)]
    assert any(s["address"] <= address < s["address"] + s["total_size"] for s in pool)
    (counted,) = manager.pool_bytes().values()
    assert counted == sum(s["total_size"] for s in pool)
    assert counted >= 256 * 1024 * 4  # the input buffer, at least
