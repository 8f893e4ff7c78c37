"""The graph ops that mark where a scope starts and ends, with TorchAir's schema.

    with npugraph_ex.scope.limit_core_num(1, 1):   %scope_enter = npugraph_ex.scope_enter(
        y = x.sin()                                     ["_op_aicore_num", "_op_vectorcore_num"],
                                                        ["1", "1"])
                                                   %sin = aten.sin(%x)
                                                   %scope_exit = npugraph_ex.scope_exit()

``scope_enter(str[] keys, str[] values, bool need_execute=False)`` and ``scope_exit(bool
need_execute=False)`` are TorchAir's ops, so its scripts and the passes it documents (which
insert these nodes themselves) run unchanged. The keys say what a block does:

- ``_user_stream_label`` (with ``_user_stream_priority``, ``_enable_inner_parallel``): a stream
  block; its ops run on the tag's side stream (a device runtime's router, ``scope.router``) or
  worker thread (the CPU replay engine, after ``plan_streams``), in program order elsewhere; a
  block inside a block runs on its own tag until its exit, then the outer tag goes on;
- ``_op_aicore_num`` / ``_op_vectorcore_num``: a ``limit_core_num`` block, which caps the intra-op
  thread count until its exit (at the larger of the two numbers given);
- any other key (``_super_kernel_scope``, ``_op_exec_never_timeout``, ...): an Ascend attribute
  block, which does nothing here (a one-time notice says so when it first runs).

The ops take and return no tensors, so every tracer would drop them as dead code: they are
registered as side-effectful, which keeps them, in program order, in Dynamo's, AOTAutograd's and
the passes' graphs. Running one applies the scope on the host, whoever runs it (eager code, a
graph run as is, the CPU replay engine, which calls their effect in their place).
``need_execute`` is accepted and ignored: a real run always applies the block.

Importing the package defines them (under ``torch.ops.npugraph_ex``), as it registers the
backend: the ops must exist before Dynamo traces a function that enters a scope.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import torch
from torch._ops import OpOverload

from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import ScopeError
from npugraph_ex.scope.router import active_router

log = logging.getLogger(__name__)

NAMESPACE = "npugraph_ex"

LIMIT_CORE_NUM = "limit_core_num"
STREAM = "stream"
ATTRIBUTES = "attributes"
"""The kind of a block whose keys only set Ascend operator attributes."""

STREAM_LABEL = "_user_stream_label"
STREAM_PRIORITY = "_user_stream_priority"
INNER_PARALLEL = "_enable_inner_parallel"
AICORE_NUM = "_op_aicore_num"
VECTORCORE_NUM = "_op_vectorcore_num"
CORE_KEYS = (AICORE_NUM, VECTORCORE_NUM)


def scope_kinds(keys: Sequence[str]) -> list[str]:
    """What a block with these keys does: ``stream``, ``limit_core_num``, both, or
    ``attributes`` (Ascend operator attributes only)."""
    kinds = [STREAM] if STREAM_LABEL in keys else []
    if any(key in CORE_KEYS for key in keys):
        kinds.append(LIMIT_CORE_NUM)
    return kinds or [ATTRIBUTES]


def core_numbers(keys: Sequence[str], values: Sequence[str]) -> list[int]:
    """The core numbers a block's keys give (none outside a ``limit_core_num`` block)."""
    numbers = []
    for key, value in zip(keys, values, strict=True):
        if key not in CORE_KEYS:
            continue
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = -1
        if number < 0:
            raise ScopeError(f"scope_enter: {key} must be an int >= 0 (as a str), got {value!r}")
        numbers.append(number)
    if numbers and max(numbers) < 1:
        raise ScopeError(f"scope_enter: a core limit of 0 cores of every kind, got {numbers!r}")
    return numbers


def core_cap(keys: Sequence[str], values: Sequence[str]) -> int | None:
    """The intra-op threads a block allows on a CPU: the larger of its core numbers (a CPU has
    one kind of core), or None for a block that does not limit cores."""
    numbers = core_numbers(keys, values)
    return max(numbers) if numbers else None


def check_block(keys: Sequence[str], values: Sequence[str]) -> None:
    """Reject what no run could apply: keys and values of different lengths, non-str entries,
    core numbers that are not positive ints."""
    if len(keys) != len(values):
        raise ScopeError(
            f"scope_enter takes one value per key, got {len(keys)} keys and {len(values)} "
            f"values: keys={list(keys)!r}, values={list(values)!r}"
        )
    core_numbers(keys, values)


active = threading.local()
"""Per thread, ``active.exits``: how to undo each scope entered and not yet exited."""


def open_exits() -> list[Callable[[], None]]:
    if not hasattr(active, "exits"):
        active.exits = []
    return active.exits


def limit_threads(values: Sequence[int]) -> Callable[[], None]:
    """Cap the intra-op threads at the larger of the two core numbers (a CPU has one kind of
    core); never raise the count."""
    previous = torch.get_num_threads()
    cap = max(values)
    if cap >= previous:
        return lambda: None
    torch.set_num_threads(cap)
    return lambda: torch.set_num_threads(previous)


def apply_scope(keys: Sequence[str], values: Sequence[str], need_execute: bool = False) -> None:
    cap = core_cap(keys, values)
    if ATTRIBUTES in scope_kinds(keys) or any(key.startswith("_super_kernel") for key in keys):
        log_once(
            log,
            logging.WARNING,
            ("ascend scope attributes", tuple(keys)),
            "scope attributes %s are Ascend-only and do nothing on this device",
            ", ".join(keys),
        )
    undo = limit_threads([cap]) if cap is not None else (lambda: None)
    router = active_router()
    if router is not None and STREAM_LABEL in keys:
        router.enter(*stream_of(keys, values))
        undo = chained(router.exit, undo)
    open_exits().append(undo)


def stream_of(keys: Sequence[str], values: Sequence[str]) -> tuple[str, int]:
    """The tag and priority of a stream block."""
    settings = dict(zip(keys, values, strict=True))
    priority = settings.get(STREAM_PRIORITY, "0")
    return settings[STREAM_LABEL], int(priority) if priority.lstrip("-").isdigit() else 0


def chained(*undos: Callable[[], None]) -> Callable[[], None]:
    def undo_all() -> None:
        for undo in undos:
            undo()

    return undo_all


def undo_scope(need_execute: bool = False) -> None:
    exits = open_exits()
    # An exit without its enter (a graph that starts inside a scope, after a graph break)
    # has nothing to undo.
    if exits:
        exits.pop()()


# The ops' kernels. Tracers run them too (Dynamo, AOTAutograd): only a real run applies the
# scope, and Dynamo checks that tracing leaves the thread count as it found it. Compilers must
# never trace into them: the check of ``is_compiling`` would become a constant.
@torch.compiler.disable
def enter_scope(keys: Sequence[str], values: Sequence[str], need_execute: bool = False) -> None:
    check_block(keys, values)
    if not torch.compiler.is_compiling():
        apply_scope(keys, values)


@torch.compiler.disable
def exit_scope(need_execute: bool = False) -> None:
    if not torch.compiler.is_compiling():
        undo_scope()


def trace_enter(keys: Sequence[str], values: Sequence[str], need_execute: bool = False) -> None:
    """``scope_enter``'s fake kernel: checks the block, applies nothing (only a real run does)."""
    check_block(keys, values)


def trace_nothing(*args: object, **kwargs: object) -> None:
    """``scope_exit``'s fake kernel: a traced scope op applies nothing."""


def define_scope_ops() -> tuple[OpOverload, OpOverload]:
    """Define ``scope_enter`` and ``scope_exit`` and register them as side-effectful."""
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    library.define("scope_enter(str[] keys, str[] values, bool need_execute=False) -> ()")
    library.define("scope_exit(bool need_execute=False) -> ()")
    library.impl("scope_enter", enter_scope, "CompositeExplicitAutograd")
    library.impl("scope_exit", exit_scope, "CompositeExplicitAutograd")
    # Tracing with fake tensors (Dynamo, AOTAutograd) runs these instead, on every release:
    # some releases do not flag the fake runs as compiling, and a real run there would leave the
    # thread count changed when a graph break stops the trace inside a block.
    torch.library.register_fake(f"{NAMESPACE}::scope_enter", trace_enter, lib=library)
    torch.library.register_fake(f"{NAMESPACE}::scope_exit", trace_nothing, lib=library)
    # The library must stay alive: its definitions go when it is collected.
    LIBRARIES.append(library)
    ops = (torch.ops.npugraph_ex.scope_enter.default, torch.ops.npugraph_ex.scope_exit.default)
    torch.fx.node._side_effectful_functions.update(ops)
    return ops


LIBRARIES: list[torch.library.Library] = []

SCOPE_ENTER, SCOPE_EXIT = define_scope_ops()


def block_of(node: torch.fx.Node) -> tuple[list[str], list[str]]:
    """The keys and values of a ``scope_enter`` node, however it was called."""
    keys = node.args[0] if node.args else node.kwargs["keys"]
    values = node.args[1] if len(node.args) > 1 else node.kwargs["values"]
    return list(keys), list(values)


def core_cap_of(node: torch.fx.Node) -> int | None:
    """``core_cap`` of a ``scope_enter`` node (None for other nodes)."""
    if node.target is not SCOPE_ENTER:
        return None
    return core_cap(*block_of(node))


def scopes_in(graph: torch.fx.Graph) -> list[str]:
    """The kinds of the scopes ``graph`` enters, in order of first appearance."""
    kinds = [
        kind
        for node in graph.find_nodes(op="call_function", target=SCOPE_ENTER)
        for kind in scope_kinds(block_of(node)[0])
    ]
    return list(dict.fromkeys(kinds))


def host_effect(op: OpOverload) -> Callable[..., None]:
    """What a replay calls for a scope op, with the op's arguments: its effect alone, without
    the dispatcher and the compiler guard around the op's kernel (a replay is never traced)."""
    return apply_scope if op is SCOPE_ENTER else undo_scope


def is_scope_marker(op: object) -> bool:
    return op is SCOPE_ENTER or op is SCOPE_EXIT
