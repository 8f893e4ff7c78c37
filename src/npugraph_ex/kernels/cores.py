"""Cores for background compiles, so that the calls they run beside keep their pace.

A compile needs a core for seconds. Shared freely with a serving loop that keeps every core busy,
it takes turns with the loop's intra-op threads: a parallel op waits for its slowest thread, and
a thread that lost its core to the compile stalls the op for a scheduler slice (tens of
milliseconds on two cores, against a sub-millisecond call). So while background work runs
(``background_cores`` = k > 0, of the n cores this process may use):

    worker process, its compiler runs,     the last k cores (affinity, inherited by children;
    the loading thread and its probes        Inductor's compile threads: k)
    replays of tiered keys                 n - k intra-op threads, set inside the replay and
                                             set back before it returns

The thread count changes only inside a replay: Dynamo guards the count a compiled function saw,
so changing it between calls would compile the function again. With k = 0, or one core, nothing
is pinned or limited.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def usable_cores() -> list[int]:
    if not hasattr(os, "sched_getaffinity"):  # pragma: no cover - not Linux
        return []
    return sorted(os.sched_getaffinity(0))


def background_cores(k: int) -> set[int]:
    """The cores background work runs on, or an empty set where it runs anywhere."""
    return set_aside(k, usable_cores())


def set_aside(k: int, cores: list[int]) -> set[int]:
    """The last ``k`` of ``cores``, leaving at least one; none where ``k`` is 0."""
    if k <= 0 or len(cores) <= 1:
        return set()
    return set(cores[-min(k, len(cores) - 1) :])


def pin(pid: int, cores: set[int]) -> None:
    """Keep process (or, with 0, the calling thread) ``pid`` and whatever it starts on
    ``cores``; nothing where ``cores`` is empty."""
    if cores:
        with contextlib.suppress(OSError):  # the process may have exited already
            os.sched_setaffinity(pid, cores)


@contextlib.contextmanager
def serving_threads(k: int) -> Iterator[None]:
    """Intra-op threads capped to leave ``k`` cores to background work, within this block."""
    cores = usable_cores()  # once: this runs in every replay while a compile is in flight
    aside = set_aside(k, cores)
    previous = torch.get_num_threads()
    cap = min(previous, len(cores) - len(aside))
    if not aside or cap >= previous:
        yield
        return
    torch.set_num_threads(cap)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
