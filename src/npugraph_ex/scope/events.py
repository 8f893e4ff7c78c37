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

TorchAir's ops for custom passes exist with its schemas and mean the same here:

- ``tagged_event_record(tag, created_inside=False)`` / ``tagged_event_wait(...)``: the events
  above. ``created_inside`` says which of TorchAir's tables holds the event (one its own passes
  made, or one from ``npu_create_tagged_event``); here an event is its tag, wherever it was made;
- ``record()`` -> an empty tensor marking the point its lane has reached; ``wait([r, ...])``:
  the lane that issues it goes on once every node it lists is done (the lanes of the blocks
  computing them are joined there by ``plan_streams``; a listed tensor of the same lane is done
  already);
- ``record_tagged_stream(t, tag)`` / ``record_tagged_stream_(t, tag)``: keep ``t``'s memory for
  the block of ``tag``; nothing to do, the joins keep every tensor a block touches;
- ``tagged_event_record_on_stream``, ``tagged_event_wait_on_stream``,
  ``tagged_stream_wait_stream``: the events above on the lane of a stream named by its id,
  device index and device type (``passes.stream_syncs`` places them).

Like the scope ops, these take or return no tensor that a tracer would keep them for, so they are
registered as side-effectful (``record`` returns the tensor ``wait`` uses). Their kernels act only
while a device runtime routes stream blocks (``scope.router``); elsewhere (eager code, the CPU
replay engine, which plans its own waits from the joins) they do nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch._ops import OpOverload

from npugraph_ex.scope.ops import LIBRARIES, NAMESPACE
from npugraph_ex.scope.router import active_router


@torch.compiler.disable
def record_event(tag: str, created_inside: bool = False) -> None:
    router = active_router()
    if router is not None:
        router.record(tag)


@torch.compiler.disable
def wait_event(tag: str, created_inside: bool = False) -> None:
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


def mark(*, device: torch.device | None = None) -> torch.Tensor:
    """``record``: an empty tensor, whose producer is the point a ``wait`` refers to."""
    return torch.empty(0, device=device)


def wait_marks(x: Sequence[torch.Tensor]) -> None:
    """``wait``: nothing to run; the joins ``plan_streams`` puts before it are the wait."""


def keep_for_tag(tensor: torch.Tensor, tag: str) -> None:
    """``record_tagged_stream``: nothing to run (the joins keep a block's memory)."""


def trace_nothing(*args: object, **kwargs: object) -> None:
    """The fake kernel: tracing orders nothing."""


KERNELS: dict[str, tuple[Callable[..., object], bool]] = {
    "tagged_event_record(str tag, bool created_inside=False) -> ()": (record_event, True),
    "tagged_event_wait(str tag, bool created_inside=False) -> ()": (wait_event, True),
    "stream_join(int block, Tensor[] touched) -> ()": (join_block, True),
    "depend(Tensor self, Tensor dependency) -> ()": (depend_on, True),
    "record(*, Device? device=None) -> Tensor": (mark, False),
    "wait(Tensor[] x) -> ()": (wait_marks, True),
    "record_tagged_stream(Tensor input, str tag) -> ()": (keep_for_tag, True),
    "record_tagged_stream_(Tensor(a!) input, str tag) -> ()": (keep_for_tag, True),
}
"""Each op's schema, its kernel, and whether tracers must keep it without users."""


ON_STREAM_KERNELS: dict[str, tuple[Callable[..., object], bool]] = {
    "tagged_event_record_on_stream(str event_tag, str stream_id, str device_index, "
    "str device_type, bool created_inside=False) -> ()": (trace_nothing, True),
    "tagged_event_wait_on_stream(str event_tag, str stream_id, str device_index, "
    "str device_type, bool created_inside=False) -> ()": (trace_nothing, True),
    "tagged_stream_wait_stream(str stream_id, str device_index, str device_type, "
    "str other_stream_id, str other_device_index, str other_device_type) -> ()": (
        trace_nothing,
        True,
    ),
}
"""TorchAir's ops naming the stream they act on: lowered to the events above before a graph
runs (``passes.stream_syncs``), so their kernels, for eager code, do nothing."""


def define_event_ops(kernels: dict[str, tuple[Callable[..., object], bool]]) -> list[OpOverload]:
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    ops = []
    for schema, (kernel, side_effect) in kernels.items():
        name = schema.split("(")[0]
        library.define(schema)
        library.impl(name, kernel, "CompositeExplicitAutograd")
        fake = mark if kernel is mark else trace_nothing
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=library)
        op = getattr(torch.ops.npugraph_ex, name).default
        if side_effect:
            torch.fx.node._side_effectful_functions.add(op)
        ops.append(op)
    LIBRARIES.append(library)
    return ops


(
    EVENT_RECORD,
    EVENT_WAIT,
    STREAM_JOIN,
    DEPEND,
    RECORD,
    WAIT,
    RECORD_TAGGED_STREAM,
    RECORD_TAGGED_STREAM_,
) = define_event_ops(KERNELS)
RECORD_ON_STREAM, WAIT_ON_STREAM, STREAM_WAIT_STREAM = define_event_ops(ON_STREAM_KERNELS)

KEEPS_FOR_TAG = (RECORD_TAGGED_STREAM, RECORD_TAGGED_STREAM_)
"""The ops that neither read nor write data for any plan: ``record_tagged_stream``'s."""
