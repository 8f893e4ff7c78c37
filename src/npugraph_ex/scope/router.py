"""Where a device runtime plugs in to run stream blocks on real side streams.

While a runtime with device streams warms up or captures a graph, it makes a router active; the
scope and event ops then call it as the graph runs, in program order:

    scope_enter(["_user_stream_label", ...], ["side", "0"])  ->  router.enter("side", 0)
    scope_exit()  (closing that block)                       ->  router.exit()
    tagged_event_record("ev") / tagged_event_wait("ev")      ->  router.record / router.wait
    stream_join(3, [...])                                    ->  router.join(3)

Block numbers count stream blocks in the order they open, as ``plan_streams`` numbers them. Blocks
may nest (eager code, or a graph run with ``plan_streams`` off; the pass splits nested blocks into
blocks side by side): an ``enter`` inside a block opens the inner block from the outer one's
stream, and its ``exit`` makes the outer one's stream current again. With no router active (eager
code, the CPU replay engine) the ops change nothing on the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol


class StreamRouter(Protocol):
    def enter(self, tag: str, priority: int) -> None: ...

    def exit(self) -> None: ...

    def record(self, tag: str) -> None: ...

    def wait(self, tag: str) -> None: ...

    def join(self, block: int) -> None: ...


ACTIVE: list[StreamRouter] = []


def active_router() -> StreamRouter | None:
    return ACTIVE[-1] if ACTIVE else None


@contextlib.contextmanager
def routing(router: StreamRouter) -> Iterator[None]:
    ACTIVE.append(router)
    try:
        yield
    finally:
        ACTIVE.remove(router)
