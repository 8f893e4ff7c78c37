"""Explicit order between stream blocks, with TorchAir's spellings.

    ready = npu_create_tagged_event("ready")       # once, outside the compiled function
    def f(x):
        a = x.sin()
        npu_tagged_event_record(ready)              # everything issued so far on this lane
        with npu_stream_switch("side"):
            npu_tagged_event_wait(ready)            # ... is done before the block goes on
            b = x.cos()
        return npu_wait_tensor(a, b) + b            # ops using the result wait for ``b``

Data needs none of these: wherever one lane uses a tensor another computes (or writes one it
reads), the replay waits there by itself (``plan_streams``). They order what data does not show:
side effects, or work a user wants finished early. A wait always refers to the latest record of
its tag issued before it; a wait with no record before it is refused when the graph is built.
"""

from __future__ import annotations

import torch

from npugraph_ex.errors import ScopeError
from npugraph_ex.scope.events import DEPEND, EVENT_RECORD, EVENT_WAIT


class TaggedEvent:
    """An event named by its tag: every record and wait of one tag refer to the same event."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __repr__(self) -> str:
        return f"TaggedEvent({self.tag!r})"


def npu_create_tagged_event(tag: str) -> TaggedEvent:
    """The event of ``tag``, to record and wait on inside compiled functions."""
    if not isinstance(tag, str) or not tag:
        raise ScopeError(f"npu_create_tagged_event takes a non-empty str tag, got {tag!r}")
    return TaggedEvent(tag)


def event_tag(event: TaggedEvent, name: str) -> str:
    if not isinstance(event, TaggedEvent):
        raise ScopeError(
            f"{name} takes an event from npu_create_tagged_event(tag), got {type(event).__name__}"
        )
    return event.tag


def npu_tagged_event_record(event: TaggedEvent) -> None:
    """Mark the point this lane has reached: a later wait on the event waits for it."""
    EVENT_RECORD(event_tag(event, "npu_tagged_event_record"))


def npu_tagged_event_wait(event: TaggedEvent) -> None:
    """Ops after this, on this lane, run once the latest record of the event is reached."""
    EVENT_WAIT(event_tag(event, "npu_tagged_event_wait"))


def npu_record_tagged_stream(tensor: torch.Tensor, tag: str) -> None:
    """TorchAir's way to keep ``tensor``'s memory until the block of ``tag`` is done with it.

    Nothing to do here: the memory of every tensor a block touches is kept until the block is
    joined, by the joins themselves. Checked and accepted so TorchAir scripts run unchanged.
    """
    if not isinstance(tensor, torch.Tensor) or not isinstance(tag, str):
        raise ScopeError(
            "npu_record_tagged_stream takes a tensor and a str tag, got "
            f"{type(tensor).__name__} and {type(tag).__name__}"
        )


def npu_wait_tensor(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    """TorchAir's explicit dependency: ops that use the result run after ``dependency`` is
    computed, whichever lane computes it. Returns ``self``, as TorchAir's does."""
    if not isinstance(self, torch.Tensor) or not isinstance(dependency, torch.Tensor):
        raise ScopeError(
            "npu_wait_tensor takes two tensors (self, dependency), got "
            f"{type(self).__name__} and {type(dependency).__name__}"
        )
    DEPEND(self, dependency)
    return self
