"""How a variant whose code changes form while it serves gets to its steady speed: the calls
until everything it watches is settled, timed one by one.

    first run -> calls while compiles run and code swaps -> all settled -> timed rounds

What is watched: npugraph_ex's keys for ``static_kernel_compile="background"`` (``KeyStates``),
the graphs compiled in a subprocess for Inductor's ``async+subprocess`` mode
(``inductor_async.Swaps``). Reported beside first call and steady speed: the seconds from the end
of the first run until the last one settled, and the slowest call meanwhile against the median
call (a swap must not stall the caller).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

UNSETTLED = ("aten", "queued", "pending", "trial")
"""States that may still change: npugraph_ex's key states (``stats()[...]["background"]``), and
``pending`` for a graph compiling in a subprocess."""


class Watched(Protocol):
    """What a settling variant is watched by: its things counted by state."""

    what: str
    """What is counted, singular (``key``, ``graph``): names the states in reports."""

    def __call__(self) -> dict[str, int]: ...

    def problem(self) -> str | None:
        """Why the variant's figures are not those its name promises (None where they are)."""


class CallTimes:
    """``fn``, timing each call while ``on``."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.on = False
        self.seconds: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.on:
            return self.fn(*args, **kwargs)
        started = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - started)


@dataclass
class Settling:
    seconds: float
    """From the end of the first run until everything watched settled (or the limit)."""
    calls: int
    slowest_call_s: float
    median_call_s: float
    states: dict[str, int]
    """Things watched per state at the end."""
    what: str = "key"
    """What the states count (``Watched.what``)."""

    def record(self) -> dict[str, Any]:
        return {
            "settle_s": round(self.seconds, 3),
            "settle_calls": self.calls,
            "slowest_call_s": round(self.slowest_call_s, 6),
            "median_call_s": round(self.median_call_s, 6),
            "slowest_over_median": round(self.slowest_call_s / self.median_call_s, 2),
            f"{self.what}_states": self.states,
        }

    def describe(self, name: str) -> str:
        states = ", ".join(f"{n} {state}" for state, n in sorted(self.states.items()))
        return (
            f"{name}: steady after {self.seconds:.1f} s ({self.calls} calls; {self.what}s: "
            f"{states or 'none'}); "
            f"slowest call meanwhile {self.slowest_call_s * 1e3:.2f} ms, "
            f"{self.slowest_call_s / self.median_call_s:.1f}x the median call"
        )


class KeyStates:
    """The keys of a variant's capture managers, by background state."""

    what = "key"

    def __init__(self, managers: list[Any]):
        self.managers = managers

    def __call__(self) -> dict[str, int]:
        states: dict[str, int] = {}
        for manager in self.managers:
            for state, count in manager.stats.summary()["background"].items():
                states[state] = states.get(state, 0) + count
        return states

    def problem(self) -> str | None:
        return None


def settle(
    block: Callable[[], float], calls: CallTimes, watched: Watched, limit_s: float
) -> Settling:
    """Run ``block`` until nothing ``watched`` may change, timing every call."""
    calls.on = True
    calls.seconds.clear()
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < limit_s:
            block()
            if not any(state in UNSETTLED for state in watched()):
                break
    finally:
        calls.on = False
    seconds = time.perf_counter() - started
    times = calls.seconds
    return Settling(
        seconds,
        len(times),
        max(times, default=0.0),
        statistics.median(times) if times else 1.0,
        watched(),
        watched.what,
    )
