"""Memory planning for the CPU replay engine: which recorded storages may share bytes.

A capture runs with ordinary allocations and keeps every tensor it made (the bytes of the dead
ones are freed as it goes, their sizes kept: ``release``). The plan then gives each storage
a kernel allocated a home for replay:

- an *intermediate* (a storage no output views) gets an offset in the pool's arena. Two
  intermediates share bytes only when no step touches both while both are live: lifetimes are
  closed intervals of step indices, so the inputs a step reads never share bytes with the outputs
  it writes;
- an *output storage* (one that an output views) goes to an output slot of the pool (see
  ``pool``), because the caller may hold it after the call.

Storages no kernel allocated (inputs, parameters, constants, and views of them) never move.
Every recorded tensor on a planned storage is later re-pointed with ``Tensor.set_`` at the same
element offset, size and strides, so views and in-place writes keep their aliasing exactly.

    capture:  mm -> T1 (own storage), relu(T1) -> T2 (own storage), T1 dead after step 2
    plan:     T1 at arena[0:n], T2 at arena[n:2n]; a later T3 may reuse arena[0:n]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from npugraph_ex.runtime.tensors import tensors_in

ALIGNMENT = 64
"""Byte alignment of every planned storage (a cache line; at least any element size)."""

View = tuple[torch.Tensor, int, tuple[int, ...], tuple[int, ...]]
"""A recorded tensor and the geometry it must keep: element offset, sizes, strides."""


@dataclass
class Buffer:
    """One storage a capture allocated, the steps that touch it and the tensors that view it."""

    nbytes: int
    first: int
    """Index of the first step that touches the storage."""
    last: int
    """Index of the last step that touches it (past the last step for outputs)."""
    views: list[View] = field(default_factory=list)
    offset: int = 0
    """Byte offset in the arena, once planned (intermediates only)."""

    def overlaps_in_time(self, other: Buffer) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass
class MemoryPlan:
    """Where each storage of one capture lives on replay."""

    intermediates: list[Buffer]
    outputs: list[Buffer]
    """Output storages in the order the outputs first reference them (slot order)."""
    arena_bytes: int

    @property
    def output_bytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.outputs)


def storage_key(tensor: torch.Tensor) -> int:
    """A storage's identity, which survives freeing its bytes (its data pointer does not:
    ``release``)."""
    return tensor.untyped_storage()._cdata


def storage_keys(values: Any) -> set[int]:
    """The :func:`storage_key` of every tensor in ``values`` (nested lists included)."""
    return {storage_key(t) for t in tensors_in(values)}


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


class BufferCollector:
    """Groups recorded tensors by storage and records when each storage is touched."""

    def __init__(self, movable: set[int], released: dict[int, int]):
        self.movable = movable
        self.released = released
        self.buffers: dict[int, Buffer] = {}
        self.seen: set[int] = set()

    def touch(self, tensor: torch.Tensor, index: int) -> Buffer | None:
        key = storage_key(tensor)
        if key not in self.movable:
            return None
        buffer = self.buffers.get(key)
        if buffer is None:
            nbytes = self.released.get(key) or tensor.untyped_storage().nbytes()
            if nbytes == 0:
                return None
            buffer = self.buffers[key] = Buffer(nbytes, index, index)
        buffer.last = max(buffer.last, index)
        if id(tensor) not in self.seen:
            self.seen.add(id(tensor))
            geometry = (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
            buffer.views.append((tensor, *geometry))
        return buffer


def plan_memory(
    step_tensors: Sequence[Iterable[torch.Tensor]],
    outputs: Sequence[Any],
    movable: set[int],
    live_from_start: Sequence[torch.Tensor] = (),
    released: dict[int, int] | None = None,
) -> MemoryPlan:
    """Plan the storages touched by the steps (``step_tensors[i]``: the tensors of step ``i``).

    ``movable``: the storages (by ``storage_key``) the capture allocated, and those of
    ``live_from_start``, tensors written before the first step (the graph's own input buffers);
    every other storage (inputs, parameters, constants) stays where it is. ``released``: the
    size of each storage the capture freed while it ran (``release``).
    """
    collector = BufferCollector(movable, released or {})
    for tensor in live_from_start:
        collector.touch(tensor, 0)
    for index, tensors in enumerate(step_tensors):
        for tensor in tensors:
            collector.touch(tensor, index)
    end = len(step_tensors)
    output_buffers: list[Buffer] = []
    for tensor in tensors_in(outputs):
        buffer = collector.touch(tensor, end)
        if buffer is not None and all(buffer is not b for b in output_buffers):
            output_buffers.append(buffer)
    intermediates = [
        b for b in collector.buffers.values() if all(b is not o for o in output_buffers)
    ]
    return MemoryPlan(intermediates, output_buffers, assign_offsets(intermediates))


def assign_offsets(buffers: list[Buffer]) -> int:
    """Give every buffer an arena offset; buffers live at the same time never overlap.

    Greedy by size: the largest buffer first, each at the lowest aligned offset that clears
    every already placed buffer whose lifetime overlaps its own. Returns the arena size.
    """
    placed: list[Buffer] = []
    for buffer in sorted(buffers, key=lambda b: (-b.nbytes, b.first)):
        offset = 0
        conflicts = sorted(
            (p for p in placed if p.overlaps_in_time(buffer)), key=lambda p: p.offset
        )
        for other in conflicts:
            if offset + buffer.nbytes <= other.offset:
                break
            offset = max(offset, aligned(other.offset + other.nbytes))
        buffer.offset = offset
        placed.append(buffer)
    return max((aligned(b.offset + b.nbytes) for b in placed), default=0)


def point_at(views: Iterable[View], storage: torch.UntypedStorage, byte_offset: int) -> None:
    """Re-point recorded tensors at ``storage``, their storage starting at ``byte_offset``.

    Runs below autograd: tensors made under inference mode may be re-pointed from anywhere.
    """
    with torch._C._AutoDispatchBelowADInplaceOrView():
        for tensor, offset, size, stride in views:
            tensor.set_(storage, byte_offset // tensor.element_size() + offset, size, stride)


def unpoint(views: Iterable[View]) -> None:
    """Point recorded tensors at no memory, so they keep no storage alive."""
    with torch._C._AutoDispatchBelowADInplaceOrView():
        for tensor, *_ in views:
            tensor.set_()
