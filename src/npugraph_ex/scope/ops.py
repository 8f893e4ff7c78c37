"""The graph ops that mark where a scope starts and ends.

    with npugraph_ex.scope.limit_core_num(1, 1):   %scope_enter = npugraph_ex.scope_enter(
        y = x.sin()                                     "limit_core_num", "", [1, 1])
                                                   %sin = aten.sin(%x)
                                                   %scope_exit = npugraph_ex.scope_exit()

They take and return no tensors, so every tracer would drop them as dead code: they are
registered as side-effectful, which keeps them, in program order, in Dynamo's, AOTAutograd's and
the passes' graphs. Running one applies the scope on the host, whoever runs it (eager code, a
graph run as is, the CPU replay engine, which calls their effect in their place):

- ``limit_core_num`` caps the intra-op thread count until its exit;
- a stream scope keeps its ops in program order on the current stream.

Importing the package defines them (under ``torch.ops.npugraph_ex``), as it registers the
backend: the ops must exist before Dynamo traces a function that enters a scope.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch
from torch._ops import OpOverload

NAMESPACE = "npugraph_ex"

LIMIT_CORE_NUM = "limit_core_num"
STREAM = "stream"

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


def apply_scope(kind: str, tag: str, values: Sequence[int]) -> None:
    undo = limit_threads(values) if kind == LIMIT_CORE_NUM else (lambda: None)
    open_exits().append(undo)


def undo_scope() -> None:
    exits = open_exits()
    # An exit without its enter (a graph that starts inside a scope, after a graph break)
    # has nothing to undo.
    if exits:
        exits.pop()()


# The ops' kernels. Tracers run them too (Dynamo, AOTAutograd): only a real run applies the
# scope, and Dynamo checks that tracing leaves the thread count as it found it. Compilers must
# never trace into them: the check of ``is_compiling`` would become a constant.
@torch.compiler.disable
def enter_scope(kind: str, tag: str, values: Sequence[int]) -> None:
    if not torch.compiler.is_compiling():
        apply_scope(kind, tag, values)


@torch.compiler.disable
def exit_scope() -> None:
    if not torch.compiler.is_compiling():
        undo_scope()


def trace_nothing(*args: object) -> None:
    """The ops' fake kernel: a traced scope op applies nothing (only a real run does)."""


def define_scope_ops() -> tuple[OpOverload, OpOverload]:
    """Define ``scope_enter`` and ``scope_exit`` and register them as side-effectful."""
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    library.define("scope_enter(str kind, str tag, int[] values) -> ()")
    library.define("scope_exit() -> ()")
    library.impl("scope_enter", enter_scope, "CompositeExplicitAutograd")
    library.impl("scope_exit", exit_scope, "CompositeExplicitAutograd")
    # Tracing with fake tensors (Dynamo, AOTAutograd) runs these instead, on every release:
    # some releases do not flag the fake runs as compiling, and a real run there would leave the
    # thread count changed when a graph break stops the trace inside a block.
    for name in ("scope_enter", "scope_exit"):
        torch.library.register_fake(f"{NAMESPACE}::{name}", trace_nothing, lib=library)
    # The library must stay alive: its definitions go when it is collected.
    LIBRARIES.append(library)
    ops = (torch.ops.npugraph_ex.scope_enter.default, torch.ops.npugraph_ex.scope_exit.default)
    torch.fx.node._side_effectful_functions.update(ops)
    return ops


LIBRARIES: list[torch.library.Library] = []

SCOPE_ENTER, SCOPE_EXIT = define_scope_ops()


def scopes_in(graph: torch.fx.Graph) -> list[str]:
    """The kinds of the scopes ``graph`` enters, in order of first appearance."""
    kinds = [node.args[0] for node in graph.find_nodes(op="call_function", target=SCOPE_ENTER)]
    return list(dict.fromkeys(kinds))


def host_effect(op: OpOverload) -> Callable[..., None]:
    """What a replay calls for a scope op, with the op's arguments: its effect alone, without
    the dispatcher and the compiler guard around the op's kernel (a replay is never traced)."""
    return apply_scope if op is SCOPE_ENTER else undo_scope


def is_scope_marker(op: object) -> bool:
    return op is SCOPE_ENTER or op is SCOPE_EXIT
