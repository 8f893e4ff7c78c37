"""The context managers that open a scope inside a compiled (or eager) function.

Each ``with`` block becomes a ``scope_enter`` ... ``scope_exit`` pair of graph ops (see ``ops``):
Dynamo traces the context manager like any Python code, so no graph break is needed.
"""

from __future__ import annotations

from typing import Any

from npugraph_ex.errors import ScopeError
from npugraph_ex.scope.ops import LIMIT_CORE_NUM, SCOPE_ENTER, SCOPE_EXIT, STREAM


class Scope:
    """A ``with`` block whose ops run under one setting."""

    def __init__(self, kind: str, tag: str, values: list[int]) -> None:
        self.kind = kind
        self.tag = tag
        self.values = values

    def __enter__(self) -> None:
        SCOPE_ENTER(self.kind, self.tag, self.values)

    def __exit__(self, *exc_info: Any) -> None:
        SCOPE_EXIT()


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def stream(tag: str, priority: int = 0) -> Scope:
    """Ops inside run as the branch named ``tag`` (TorchAir's ``npu_stream_switch``).

    Passes never move or fuse ops across the scope's edges. Every device runs the branch in
    program order on the current stream: parallel branches on side streams are not built.
    """
    if not isinstance(tag, str) or not tag:
        raise ScopeError(f"stream tag must be a non-empty str, got {tag!r}: name the branch")
    if not is_int(priority):
        raise ScopeError(f"stream priority must be an int, got {priority!r} (tag={tag!r})")
    return Scope(STREAM, tag, [priority])


def limit_core_num(op_aicore_num: int, op_vectorcore_num: int) -> Scope:
    """Ops inside use at most this many cores.

    On CPU the cap is on intra-op threads: the larger of the two numbers (a CPU has one kind of
    core), and never above the count already set.
    """
    values = (op_aicore_num, op_vectorcore_num)
    if not all(is_int(v) and v >= 1 for v in values):
        raise ScopeError(
            f"limit_core_num takes two ints >= 1 (op_aicore_num, op_vectorcore_num), got {values!r}"
        )
    return Scope(LIMIT_CORE_NUM, "", list(values))
