"""The context managers that open a scope inside a compiled (or eager) function.

Each ``with`` block becomes a ``scope_enter(keys, values)`` ... ``scope_exit()`` pair of graph
ops (see ``ops``), with TorchAir's keys: Dynamo traces the context manager like any Python code,
so no graph break is needed.

    with stream("side", 1):   ->  scope_enter(["_user_stream_label", "_user_stream_priority"],
                                               ["side", "1"])
"""

from __future__ import annotations

from typing import Any

from npugraph_ex.errors import ScopeError
from npugraph_ex.scope.ops import (
    AICORE_NUM,
    INNER_PARALLEL,
    SCOPE_ENTER,
    SCOPE_EXIT,
    STREAM_LABEL,
    STREAM_PRIORITY,
    VECTORCORE_NUM,
)


class Scope:
    """A ``with`` block whose ops run under one setting (TorchAir's keys and str values)."""

    def __init__(self, keys: list[str], values: list[str]) -> None:
        self.keys = keys
        self.values = values

    def __enter__(self) -> None:
        SCOPE_ENTER(self.keys, self.values)

    def __exit__(self, *exc_info: Any) -> None:
        SCOPE_EXIT()


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def stream(tag: str, priority: int = 0) -> Scope:
    """Ops inside run as the branch named ``tag``, beside the main path.

    The CPU replay engine runs each tag's blocks on a worker thread of its own; CUDA and NPU
    graphs put them on a side stream per tag. Where the main path (or another tag) uses what a
    block computes, or writes what it reads, ``plan_streams`` makes it wait for the block there,
    and every block is finished before the graph returns. Passes never move or fuse ops across
    the scope's edges. Blocks nest: inside another block, the inner tag holds until the inner
    block's end, then the outer one's again.
    """
    check_stream(tag, priority)
    return Scope([STREAM_LABEL, STREAM_PRIORITY], [tag, str(priority)])


def npu_stream_switch(
    stream_tag: str, stream_priority: int = 0, enable_inner_parallel: bool = True
) -> Scope:
    """TorchAir's spelling of :func:`stream`; ``enable_inner_parallel`` is recorded in the
    block and changes nothing here."""
    check_stream(stream_tag, stream_priority)
    if not isinstance(enable_inner_parallel, bool):
        raise ScopeError(
            f"npu_stream_switch enable_inner_parallel must be a bool, got {enable_inner_parallel!r}"
        )
    return Scope(
        [STREAM_LABEL, STREAM_PRIORITY, INNER_PARALLEL],
        [stream_tag, str(stream_priority), str(enable_inner_parallel)],
    )


def check_stream(tag: Any, priority: Any) -> None:
    if not isinstance(tag, str) or not tag:
        raise ScopeError(f"stream tag must be a non-empty str, got {tag!r}: name the branch")
    if not is_int(priority):
        raise ScopeError(f"stream priority must be an int, got {priority!r} (tag={tag!r})")


def limit_core_num(op_aicore_num: int, op_vectorcore_num: int) -> Scope:
    """Ops inside use at most this many cores.

    On CPU the cap is on intra-op threads: the larger of the two numbers (a CPU has one kind of
    core), and never above the count already set. Either may be 0 (TorchAir's "no cores of
    that kind"), not both.
    """
    values = (op_aicore_num, op_vectorcore_num)
    if not all(is_int(v) and v >= 0 for v in values) or max(values) < 1:
        raise ScopeError(
            "limit_core_num takes two ints >= 0, at least one of them >= 1 (op_aicore_num, "
            f"op_vectorcore_num), got {values!r}"
        )
    return Scope([AICORE_NUM, VECTORCORE_NUM], [str(v) for v in values])


def super_kernel(scope: str | None, options: str = "") -> Scope:
    """TorchAir's super-kernel block: Ascend fuses the ops inside into one kernel. Accepted and
    kept in the graph as a block (passes do not fuse across its edges); it does nothing else on
    other devices, and a one-time warning says so when it first runs."""
    if scope is not None and not isinstance(scope, str):
        raise ScopeError(f"super_kernel scope must be a str or None, got {scope!r}")
    if not isinstance(options, str):
        raise ScopeError(f"super_kernel options must be a str, got {options!r}")
    return Scope(["_super_kernel_scope", "_super_kernel_options"], [scope or "", options])


def op_never_timeout(enable: bool = True) -> Scope:
    """TorchAir's block whose ops never time out on Ascend. Accepted and kept in the graph as a
    block; other devices have no operator timeout, and a one-time warning says so when it first
    runs."""
    if not isinstance(enable, bool):
        raise ScopeError(f"op_never_timeout enable must be a bool, got {enable!r}")
    return Scope(["_op_exec_never_timeout"], [str(enable)])


def data_dump() -> Scope:
    """TorchAir's block whose ops Ascend dumps. Accepted and kept in the graph as a block; here
    tensors are dumped by the ``dump_tensor_data`` option (``data_dump_nodes`` picks the ops),
    and a one-time warning says so when it first runs."""
    return Scope(["_data_dump"], ["True"])
