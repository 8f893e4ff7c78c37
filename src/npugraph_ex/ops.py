"""TorchAir's ``ops`` functions for ordering stream blocks, as ``npugraph_ex.ops``.

Each puts one of the ops of ``scope.events`` in the graph (they exist under
``torch.ops.npugraph_ex`` with TorchAir's schemas, for custom passes to insert):

    ev = npu_create_tagged_event("ready")       (a Python object: no op)
    npu_tagged_event_record(ev)           ->    npugraph_ex.tagged_event_record("ready")
    npu_tagged_event_wait(ev)             ->    npugraph_ex.tagged_event_wait("ready")
    npu_record_tagged_stream(t, "side")         (checked; nothing to keep: see below)
    r = record()                          ->    %r = npugraph_ex.record()
    wait([r])                             ->    npugraph_ex.wait([%r])

A wait (of an event, or of what ``record`` marked) holds back the ops after it on its lane until
the lane that recorded has reached the record. ``npu_record_tagged_stream`` puts no op in the
graph: every tensor a stream block touches is kept until the block is joined.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from npugraph_ex.errors import ScopeError
from npugraph_ex.scope.events import RECORD, WAIT
from npugraph_ex.scope.ordering import (
    TaggedEvent,
    npu_create_tagged_event,
    npu_record_tagged_stream,
    npu_tagged_event_record,
    npu_tagged_event_wait,
)

__all__ = [
    "TaggedEvent",
    "npu_create_tagged_event",
    "npu_record_tagged_stream",
    "npu_tagged_event_record",
    "npu_tagged_event_wait",
    "record",
    "wait",
]


def record() -> torch.Tensor:
    """Mark the point this lane has reached: an empty tensor for :func:`wait` to name."""
    return RECORD()


def wait(tensors: Sequence[torch.Tensor]) -> None:
    """Ops after this, on this lane, run once every tensor of ``tensors`` is computed (the marks
    of :func:`record` among them: everything issued before them on their lane)."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ScopeError(
            f"npugraph_ex.ops.wait takes a non-empty list of tensors (from record()), got "
            f"{tensors!r}"
        )
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise ScopeError(
                f"npugraph_ex.ops.wait takes tensors only (from record()), got "
                f"{type(tensor).__name__} in {type(tensors).__name__}"
            )
    WAIT(list(tensors))
