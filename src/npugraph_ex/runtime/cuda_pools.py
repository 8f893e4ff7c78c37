"""CUDA graph pools through the caching allocator's private-pool API.

- ``pool_bytes``: what a pool holds, read from the allocator's own segments (each segment
  records the pool that owns it), not inferred from how much the process reserved around a
  capture: a capture that reuses blocks freed by another reads 0 there, and a segment the
  allocator keeps for another pool is never counted against this one.
- ``allocating_in``: new allocations of this thread go to a graph pool, as they do during a
  capture; the graph's own input buffers are moved there before capture, so that a key's memory
  lives in one place and is released with it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from npugraph_ex.runtime.output_copies import byte_view


def pool_bytes(segments: Iterable[dict[str, Any]], pool: Any) -> tuple[int, int]:
    """(reserved, allocated) bytes of ``pool``'s segments in an allocator snapshot."""
    owned = [s for s in segments if tuple(s.get("segment_pool_id", ())) == tuple(pool)]
    return sum(s["total_size"] for s in owned), sum(s["allocated_size"] for s in owned)


def can_allocate_in_pool() -> bool:
    return hasattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool")


@contextlib.contextmanager
def allocating_in(pool: Any, device: torch.device) -> Iterator[None]:
    """New allocations of this thread on ``device`` come from ``pool`` (which must exist: a
    graph was captured into it, as ``hold_pool`` does for every pool we make)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(index)
    torch._C._cuda_beginAllocateCurrentThreadToPool(index, pool)
    try:
        yield
    finally:
        torch._C._cuda_endAllocateToPool(index, pool)
        torch._C._cuda_releasePool(index, pool)


def move_into_pool(buffers: Sequence[torch.Tensor], pool: Any) -> None:
    """Re-point each buffer (the same tensor object, so its owner keeps it) at a copy of its
    bytes allocated in ``pool``, which a graph must hold (``allocating_in``)."""
    storages = {b.untyped_storage().data_ptr(): b.untyped_storage() for b in buffers}
    with allocating_in(pool, buffers[0].device):
        moved = {
            address: torch.empty(s.nbytes(), dtype=torch.uint8, device=buffers[0].device)
            for address, s in storages.items()
        }
    with torch.no_grad(), torch._C._AutoDispatchBelowADInplaceOrView():
        for address, own in moved.items():
            own.copy_(byte_view(storages[address]))
        for buffer in buffers:  # buffers sharing a storage share its copy
            storage = moved[buffer.untyped_storage().data_ptr()].untyped_storage()
            buffer.set_(storage, buffer.storage_offset(), buffer.size(), buffer.stride())


class MovedBuffers:
    """The input buffers already moved into a pool, by identity and weakly: a key captured
    again (its compiled kernels beside its ATen replay) keeps its buffers where the graphs
    already captured read them."""

    def __init__(self) -> None:
        self.refs: dict[int, weakref.ref] = {}

    def holds(self, buffer: torch.Tensor) -> bool:
        ref = self.refs.get(id(buffer))
        return ref is not None and ref() is buffer

    def add(self, buffers: Sequence[torch.Tensor]) -> None:
        self.refs = {key: ref for key, ref in self.refs.items() if ref() is not None}
        self.refs.update((id(b), weakref.ref(b)) for b in buffers)
