"""Scopes inside a compiled function: ``with npugraph_ex.scope.limit_core_num(1, 1): ...``.

A scope is a pair of graph ops around the ops it holds; passes never fuse or move ops across it.
TorchAir's spellings (``npu_stream_switch``, ``npu_wait_tensor``, the tagged events of
``ordering``, ``super_kernel``, and the ops
``torch.ops.npugraph_ex.scope_enter(keys, values)`` / ``scope_exit()``) work as they are.
"""

from __future__ import annotations

from npugraph_ex.scope.context import (
    data_dump,
    limit_core_num,
    npu_stream_switch,
    op_never_timeout,
    stream,
    super_kernel,
)
from npugraph_ex.scope.ordering import (
    TaggedEvent,
    npu_create_tagged_event,
    npu_record_tagged_stream,
    npu_tagged_event_record,
    npu_tagged_event_wait,
    npu_wait_tensor,
)

__all__ = [
    "TaggedEvent",
    "data_dump",
    "limit_core_num",
    "npu_create_tagged_event",
    "npu_record_tagged_stream",
    "npu_stream_switch",
    "npu_tagged_event_record",
    "npu_tagged_event_wait",
    "npu_wait_tensor",
    "op_never_timeout",
    "stream",
    "super_kernel",
]
