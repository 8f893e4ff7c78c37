"""Scopes inside a compiled function: ``with npugraph_ex.scope.limit_core_num(1, 1): ...``.

A scope is a pair of graph ops around the ops it holds; passes never fuse or move ops across it.
"""

from __future__ import annotations

from npugraph_ex.scope.context import limit_core_num, stream

npu_stream_switch = stream
"""TorchAir's spelling of :func:`stream`."""

__all__ = ["limit_core_num", "npu_stream_switch", "stream"]
