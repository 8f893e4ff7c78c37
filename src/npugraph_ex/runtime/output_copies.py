"""Outputs moved into memory of their own, keeping how they alias each other and the inputs.

Used where a graph's outputs must leave the memory the graph rewrites: the copy-out graph of a
device pool shared by several captures, and ``clone_output``; and, over the same bytes rather
than copies, for the storages a device graph hands its caller (``handed_out``). Storages are
made per storage, not per output, so two outputs that are views of one buffer (``h`` and
``h.t()``) stay views of one copy, as they are in eager; outputs that alias an input keep
aliasing the input (``rebased``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """``storage`` as a tensor of its bytes."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
        storage, 0, (storage.nbytes(),), (1,)
    )


def references(storage: torch.UntypedStorage) -> int:
    """How many tensors and handles reference ``storage``."""
    return torch._C._storage_Use_Count(storage._cdata)


def input_addresses(inputs: Sequence[Any]) -> set[int]:
    """The storage addresses of the tensor ``inputs``: outputs there alias an input."""
    return {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}


def rebased(
    outputs: list[Any],
    inputs: set[int],
    storage_for: Callable[[torch.UntypedStorage], torch.UntypedStorage],
) -> tuple[list[Any], dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]]]:
    """The outputs as tensors on storages ``storage_for`` makes, one per output storage:
    (new outputs, {address: (old storage, new storage)}).

    Outputs on a storage at one of ``inputs`` (addresses, ``input_addresses``), empty ones and
    non-tensors are kept as they are; outputs sharing a storage share its new one, at their own
    offsets, sizes and strides.
    """
    made: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
    moved: list[Any] = []
    for output in outputs:
        storage = output.untyped_storage() if isinstance(output, torch.Tensor) else None
        if storage is None or storage.nbytes() == 0 or storage.data_ptr() in inputs:
            moved.append(output)
            continue
        if storage.data_ptr() not in made:
            made[storage.data_ptr()] = (storage, storage_for(storage))
        own = made[storage.data_ptr()][1]
        alias = torch.empty(0, dtype=output.dtype, device=output.device)
        moved.append(alias.set_(own, output.storage_offset(), output.shape, output.stride()))
    return moved, made


def private_copies(outputs: list[Any], inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Storages of their own for the outputs the pool holds: (new outputs, (source, copy) pairs).

    Outputs that alias an input keep aliasing it; outputs sharing a storage keep sharing one.
    The copies are allocated, not filled: the caller copies each pair (inside a device graph,
    or at once with ``copied_outputs``).
    """

    copies: dict[int, torch.Tensor] = {}  # each copy as the tensor of its bytes

    def allocated(storage: torch.UntypedStorage) -> torch.UntypedStorage:
        own = torch.empty(storage.nbytes(), dtype=torch.uint8, device=storage.device)
        copies[storage.data_ptr()] = own
        return own.untyped_storage()

    moved, made = rebased(outputs, input_addresses(inputs), allocated)
    return moved, [(byte_view(old), copies[address]) for address, (old, _) in made.items()]


def copied_outputs(outputs: list[Any], inputs: Sequence[Any]) -> list[Any]:
    """``private_copies``, filled now: what ``clone_output=True`` returns."""
    moved, pairs = private_copies(outputs, inputs)
    for source, own in pairs:
        own.copy_(source)
    return moved
