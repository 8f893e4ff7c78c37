"""CUDA graph pools through the caching allocator's private-pool API.

- ``pool_bytes``: what a pool holds, read from the allocator's own segments (each segment
  records the pool that owns it), not inferred from how much the process reserved around a
  capture: a capture that reuses blocks freed by another reads 0 there, and a segment the
  allocator keeps for another pool is never counted against this one.
- ``allocating_in``: new allocations of this thread go to a graph pool, as they do during a
  capture; a key's own input buffers are allocated there before its first capture
  (``copies_in_pool``), so that a key's memory lives in one place and is released with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch


def pool_bytes(segments: Iterable[dict[str, Any]], pool: Any) -> tuple[int, int]:
    """(reserved, allocated) bytes of ``pool``'s segments in an allocator snapshot."""
    owned = [s for s in segments if tuple(s.get("segment_pool_id", ())) == tuple(pool)]
    return sum(s["total_size"] for s in owned), sum(s["allocated_size"] for s in owned)


def can_allocate_in_pool() -> bool:
    """Whether this process routes a thread's allocations to a graph pool: CUDA is there, and
    the binding (a CPU-only build defines a placeholder of it once ``torch.cuda.memory`` is
    imported, so its presence alone does not say)."""
    return torch.cuda.is_available() and hasattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool")


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


def copies_in_pool(sources: Sequence[torch.Tensor], pool: Any) -> list[torch.Tensor]:
    """A copy of each of ``sources`` (one CUDA device's tensors; sizes and strides as
    ``clone`` keeps them) allocated in ``pool``, which a graph must hold (``allocating_in``)."""
    with allocating_in(pool, sources[0].device):
        buffers = [torch.empty_like(s, memory_format=torch.preserve_format) for s in sources]
    with torch.no_grad():
        for buffer, source in zip(buffers, sources, strict=True):
            buffer.copy_(source)
    return buffers
