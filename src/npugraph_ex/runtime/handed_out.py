"""What a device graph hands its caller: aliases that become unreadable once overwritten.

A device graph (CUDA, NPU) writes its outputs into the same memory on every replay. The caller
therefore never gets the graph's own tensors but tensors on storages of their own over the same
bytes (one storage per output storage, so outputs that are views of one another stay views of
one storage; outputs that alias an input are passed through). Before the key replays again,
each storage handed out last time that the caller still holds (an output, or any view made of
it) is made unreadable: reading it raises an error naming ``clone_output=True``, where eager
would have given the old values and a silent read would give the new ones. cudagraph trees do
the same.

A released graph's last outputs stay readable for as long as the caller holds them: the graph's
own tensors, which own the bytes, are kept until a later release finds them no longer held.

Torch builds without the storage hook (CPU-only builds, where ``torch_npu`` runs) hand out the
same aliases but cannot make them unreadable: the next replay of the key overwrites what the
caller holds in place, and says so once (``HELD_OVERWRITTEN``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from npugraph_ex.compat import storage_unreadable_marker
from npugraph_ex.debug.once import log_once
from npugraph_ex.runtime.output_copies import input_addresses, rebased, references

OVERWRITTEN = (
    "npugraph_ex: this tensor is an output of a captured graph that a later call with the same "
    "input shapes has overwritten (a replay reuses the graph's output memory). Clone what you "
    "keep before calling again, or compile with options={'clone_output': True}."
)

HELD_OVERWRITTEN = (
    "npugraph_ex: an output of an earlier call that you still hold is being overwritten by a "
    "call with the same input shapes (a replay reuses the graph's output memory, and this torch "
    "build cannot make the old output unreadable). Clone what you keep before calling again, or "
    "compile with options={'clone_output': True}. Said once."
)

MARK_UNREADABLE = storage_unreadable_marker()

log = logging.getLogger(__name__)


def same_bytes(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A storage of its own over ``storage``'s bytes, owning none of them."""
    return torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), storage.device, storage.nbytes()
    )


class HandedOut:
    """The storages one graph handed out at its last replay (see module docstring)."""

    lingering: list[tuple[list[torch.UntypedStorage], list[Any]]] = []
    """Released graphs' outputs kept alive for the storages a caller still holds."""

    def __init__(self, inputs: Sequence[Any]):
        self.inputs = input_addresses(inputs)
        """Addresses of the input storages: outputs on them are the caller's, passed through."""
        self.storages: list[torch.UntypedStorage] = []

    def hand_out(self, outputs: list[Any]) -> list[Any]:
        """Aliases of ``outputs`` for the caller, on storages noted for ``before_replay``."""
        aliases, made = rebased(outputs, self.inputs, same_bytes)
        self.storages = [own for _, own in made.values()]
        return aliases

    def before_replay(self) -> None:
        """Make what the caller still holds of the last hand-out unreadable: the replay about
        to run overwrites it. Without the hook, say once that it does."""
        held = [storage for storage in self.storages if references(storage) > 1]
        self.storages = []
        if held and MARK_UNREADABLE is None:
            log_once(log, logging.WARNING, "held output overwritten", HELD_OVERWRITTEN)
            return
        for storage in held:
            MARK_UNREADABLE(storage, OVERWRITTEN)

    def release(self, owners: list[Any]) -> None:
        """The graph goes: keep ``owners`` (its outputs, which own the bytes) while the caller
        holds what was handed out last, and let go of those of earlier releases it dropped."""
        held = [s for s in self.storages if references(s) > 1]
        self.storages = []
        kept = HandedOut.lingering
        kept[:] = [(s, o) for s, o in kept if any(references(x) > 1 for x in s)]
        if held:
            kept.append((held, owners))
