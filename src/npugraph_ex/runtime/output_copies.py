"""Outputs moved into memory of their own, keeping how they alias each other and the inputs.

Used where a graph's outputs must leave the memory the graph rewrites: the copy-out graph of a
device pool shared by several captures, and ``clone_output``. Copies are made per storage, not
per output, so two outputs that are views of one buffer (``h`` and ``h.t()``) stay views of one
copy, as they are in eager; outputs that alias an input keep aliasing the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """``storage`` as a tensor of its bytes."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
        storage, 0, (storage.nbytes(),), (1,)
    )


def private_copies(outputs: list[Any], inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Storages of their own for the outputs the pool holds: (new outputs, (source, copy) pairs).

    Outputs that alias an input keep aliasing it; outputs sharing a storage keep sharing one.
    The copies are allocated, not filled: the caller copies each pair (inside a device graph,
    or at once with ``copied_outputs``).
    """
    input_storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    moved: list[Any] = []
    for output in outputs:
        storage = output.untyped_storage() if isinstance(output, torch.Tensor) else None
        if storage is None or storage.nbytes() == 0 or storage.data_ptr() in input_storages:
            moved.append(output)
            continue
        if storage.data_ptr() not in copies:
            own = torch.empty(storage.nbytes(), dtype=torch.uint8, device=output.device)
            copies[storage.data_ptr()] = (byte_view(storage), own)
        own_storage = copies[storage.data_ptr()][1].untyped_storage()
        moved.append(
            torch.empty(0, dtype=output.dtype, device=output.device).set_(
                own_storage, output.storage_offset(), output.shape, output.stride()
            )
        )
    return moved, list(copies.values())


def copied_outputs(outputs: list[Any], inputs: Sequence[Any]) -> list[Any]:
    """``private_copies``, filled now: what ``clone_output=True`` returns."""
    moved, pairs = private_copies(outputs, inputs)
    for source, own in pairs:
        own.copy_(source)
    return moved
