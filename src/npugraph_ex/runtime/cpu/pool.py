"""CPU memory pools: one arena for intermediates and output slots, shared by many captures.

Every capture placed in a pool puts its intermediates in the pool's one arena (a single
resizable storage: growing it moves every capture's tensors at once) and its output storages in
the pool's output slots, slot ``i`` holding the ``i``-th output storage of whichever capture
replayed last. Memory therefore follows the largest capture, not the sum of them.

Outputs are where sharing could hurt a caller: a replay of one capture (one graph key) may
overwrite bytes that still hold outputs of another. The rule, checked when a capture takes a
slot over from another one (a key switch):

- the caller still holds the slot's storage (any tensor or view of it): the storage is left to
  the caller, untouched from then on, and the slot gets fresh memory. Holding an older key's
  output therefore costs one allocation, and its values are never overwritten;
- nobody holds it: the bytes are reused.

A replay of the same capture that wrote the slot last follows the same rule: the outputs it
returned last time are overwritten in place only if the caller no longer holds them; a held one
is left to the caller and the slot gets fresh memory. So an output keeps its values as long as
the caller holds it, as in eager, and a loop that drops each output before the next call never
allocates. Whether the caller holds a storage is read from its reference count: on a key switch
with the capture that last wrote it first detached from it (so only the pool's own handle
remains); on a replay of the same capture against the count noted when it last handed the
storage out (``OutputSlot.handed_out``).

Replays and captures of one pool run one at a time (``lock``): they share bytes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from npugraph_ex.runtime.cpu.memory import MemoryPlan, point_at, unpoint
from npugraph_ex.runtime.output_copies import byte_view, references


def fresh_storage(nbytes: int) -> torch.UntypedStorage:
    return torch.empty(nbytes, dtype=torch.uint8).untyped_storage()


def held_elsewhere(storage: torch.UntypedStorage) -> bool:
    """Whether anything but the pool's own handle references ``storage``."""
    return references(storage) > 1


@dataclass(eq=False)
class OutputSlot:
    storage: torch.UntypedStorage | None = None
    writer: PlacedCapture | None = None
    """The capture whose tensors point at ``storage`` (and whose outputs it holds)."""
    own_references: int = 0
    """References to ``storage`` when its writer last handed it out (the pool's handle and the
    writer's tensors): more at the writer's next replay means the caller still holds it."""

    def handed_out(self) -> None:
        """Note the references the pool and the writer hold, before the caller gets aliases."""
        if self.storage is not None:
            self.own_references = references(self.storage)

    def held_by_caller(self) -> bool:
        """Whether the caller still holds what the writer handed out last (checked before the
        writer replays again)."""
        return self.storage is not None and references(self.storage) > self.own_references


class PlacedCapture:
    """One capture's share of a pool: its arena extent and its output storages, by slot.

    Only the output storages' tensors are kept here (they move between slots); the
    intermediates' bookkeeping is dropped once they sit in the arena.
    """

    def __init__(self, pool: CpuPool, plan: MemoryPlan):
        self.pool = pool
        self.outputs = plan.outputs
        self.arena_bytes = plan.arena_bytes
        self.nbytes = plan.arena_bytes + plan.output_bytes
        """Bytes this capture needs: its arena extent plus its output storages."""

    def enter(self) -> None:
        """Point this capture's output tensors at its slots, fresh memory for an output of its
        own that the caller still holds (call under ``pool.lock``)."""
        for index, slot in enumerate(self.pool.slots[: len(self.outputs)]):
            if slot.writer is not self:
                self.pool.take_slot(index, self)
            elif slot.held_by_caller():
                self.pool.renew_slot(index, self)

    def handing_out(self) -> None:
        """Note what the slots' storages are referenced by before the caller gets its aliases
        (call under ``pool.lock``, after the replay)."""
        for slot in self.pool.slots[: len(self.outputs)]:
            slot.handed_out()

    def leave(self) -> None:
        """Give the slots up (the capture is being released)."""
        with self.pool.lock:
            for slot, buffer in zip(self.pool.slots, self.outputs, strict=False):
                if slot.writer is self:
                    unpoint(buffer.views)
                    slot.writer = None


class CpuPool:
    """A CPU graph pool. Captures placed in the same pool share memory (see module docstring).

    Make one with ``npugraph_ex.graph_pool_handle("cpu")`` and pass it as
    ``options={"use_graph_pool": pool}`` to share it across compiled functions.
    """

    def __init__(self) -> None:
        self.arena = fresh_storage(0)
        self.slots: list[OutputSlot] = []
        self.lock = threading.RLock()

    def __repr__(self) -> str:
        return f"CpuPool(id=0x{id(self):x}, nbytes={self.nbytes})"

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds: the arena and the slots' current storages."""
        slots = sum(s.storage.nbytes() for s in self.slots if s.storage is not None)
        return self.arena.nbytes() + slots

    def place(self, plan: MemoryPlan) -> PlacedCapture:
        """Move a capture's planned storages into this pool; its outputs enter the slots.

        Intermediates are dead between replays and move without their values. Output storages
        keep theirs (the capturing call returns them; see ``fill_slot``).
        """
        placed = PlacedCapture(self, plan)
        with self.lock:
            if self.arena.nbytes() < plan.arena_bytes:
                # Nothing in the arena outlives a replay: free the old bytes before taking new
                # ones rather than copying them over.
                self.arena.resize_(0)
                self.arena.resize_(plan.arena_bytes)
            for buffer in plan.intermediates:
                point_at(buffer.views, self.arena, buffer.offset)
            while len(self.slots) < len(plan.outputs):
                self.slots.append(OutputSlot())
            for index, buffer in enumerate(plan.outputs):
                self.fill_slot(index, placed, buffer.views[0][0].untyped_storage())
        return placed

    def vacated(self, index: int) -> OutputSlot:
        """Slot ``index`` with its previous writer's tensors detached from its storage: then only
        the pool's handle and the caller's tensors can reference that storage."""
        slot = self.slots[index]
        if slot.writer is not None:
            unpoint(slot.writer.outputs[index].views)
        return slot

    def fill_slot(self, index: int, capture: PlacedCapture, computed: torch.UntypedStorage) -> None:
        """Make ``computed``, the capture's ``index``-th output storage, slot ``index``'s: the
        storage itself where it is at least as large as the slot's (no copy, and the slot's
        old storage goes, to the caller if it holds it), else its bytes copied into the slot's
        (so a slot keeps the largest key's size and later replays need no new memory)."""
        slot = self.vacated(index)
        storage = slot.storage
        if storage is None or storage.nbytes() <= computed.nbytes() or held_elsewhere(storage):
            slot.storage = computed
        else:
            byte_view(storage)[: computed.nbytes()].copy_(byte_view(computed))
            point_at(capture.outputs[index].views, storage, 0)
        slot.writer = capture

    def renew_slot(self, index: int, capture: PlacedCapture) -> None:
        """The caller holds what ``capture``, the slot's writer, handed out last: the storage is
        left to the caller and the slot gets fresh memory (the writer's tensors re-pointed)."""
        buffer = capture.outputs[index]
        storage = self.slots[index].storage = fresh_storage(buffer.nbytes)
        point_at(buffer.views, storage, 0)

    def take_slot(self, index: int, capture: PlacedCapture) -> None:
        """Point ``capture``'s ``index``-th output storage at slot ``index``."""
        slot = self.vacated(index)
        buffer = capture.outputs[index]
        storage = slot.storage
        if storage is None or storage.nbytes() < buffer.nbytes or held_elsewhere(storage):
            storage = slot.storage = fresh_storage(buffer.nbytes)
        point_at(buffer.views, storage, 0)
        slot.writer = capture
