"""The graph ops that order stream blocks: tagged events, joins and tensor dependencies.

    ev = npu_create_tagged_event("ready")      (a Python object: no op)
    npu_tagged_event_record(ev)          ->    npugraph_ex.tagged_event_record("ready")
    with npu_stream_switch("side"):
        npu_tagged_event_wait(ev)        ->    npugraph_ex.tagged_event_wait("ready")
    b = npu_wait_tensor(a, dep)          ->    npugraph_ex.depend(a, dep); b is a
    (inserted by ``plan_streams``)       ->    npugraph_ex.stream_join(3, [t0, t1, ...])

A wait waits for the latest record of its tag issued before it, as ``torch.cuda.Event`` does.
``stream_join(block, touched)`` is where the lane that issues it waits for stream block number
``block`` to finish; ``touched`` lists every tensor the block reads or writes, so that no tensor
of the block is freed (or its memory reused) before the join.

Like the scope ops, these take or return no tensor that a tracer would keep them for, so they are
registered as side-effectful. Their kernels act only while a device runtime routes stream blocks
(``scope.router``); elsewhere (eager code, the CPU replay engine, which plans its own waits from
the joins) they do nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._ops import OpOverload

from npugraph_ex.scope.ops import LIBRARIES, NAMESPACE
from npugraph_ex.scope.router import active_router


@torch.compiler.disable
def record_event(tag: str) -> None:
    router = active_router()
    if router is not None:
        router.record(tag)


@torch.compiler.disable
def wait_event(tag: str) -> None:
    router = active_router()
    if router is not None:
        router.wait(tag)


@torch.compiler.disable
def join_block(block: int, touched: Sequence[torch.Tensor]) -> None:
    router = active_router()
    if router is not None:
        router.join(block)


def depend_on(self: torch.Tensor, dependency: torch.Tensor) -> None:
    """Nothing to run: the op's place in the graph, reading both tensors, is the dependency."""


def trace_nothing(*args: object, **kwargs: object) -> None:
    """The fake kernel: tracing orders nothing."""


def define_event_ops() -> tuple[OpOverload, OpOverload, OpOverload, OpOverload]:
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    kernels = {
        "tagged_event_record(str tag) -> ()": record_event,
        "tagged_event_wait(str tag) -> ()": wait_event,
        "stream_join(int block, Tensor[] touched) -> ()": join_block,
        "depend(Tensor self, Tensor dependency) -> ()": depend_on,
    }
    for schema, kernel in kernels.items():
        name = schema.split("(")[0]
        library.define(schema)
        library.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", trace_nothing, lib=library)
    LIBRARIES.append(library)
    namespace = torch.ops.npugraph_ex
    ops = (
        namespace.tagged_event_record.default,
        namespace.tagged_event_wait.default,
        namespace.stream_join.default,
        namespace.depend.default,
    )
    torch.fx.node._side_effectful_functions.update(ops)
    return ops


EVENT_RECORD, EVENT_WAIT, STREAM_JOIN, DEPEND = define_event_ops()
