"""How a variant whose keys change form while it serves (``static_kernel_compile="background"``)
gets to its steady speed: the calls until every key is settled, timed one by one.

    first run -> calls while compiles run and keys swap -> every key settled -> timed rounds

Reported beside first call and steady speed: the seconds from the end of the first run until
the last key settled, and the slowest call meanwhile against the median call (a swap must not
stall the caller).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

UNSETTLED = ("aten", "pending", "trial")
"""Key states (``stats()[...]["background"]``) that may still change."""


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
    """From the end of the first run until every key settled (or the limit)."""
    calls: int
    slowest_call_s: float
    median_call_s: float
    states: dict[str, int]
    """Keys per state at the end."""

    def record(self) -> dict[str, Any]:
        return {
            "settle_s": round(self.seconds, 3),
            "settle_calls": self.calls,
            "slowest_call_s": round(self.slowest_call_s, 6),
            "median_call_s": round(self.median_call_s, 6),
            "slowest_over_median": round(self.slowest_call_s / self.median_call_s, 2),
            "key_states": self.states,
        }

    def describe(self, name: str) -> str:
        states = ", ".join(f"{n} {state}" for state, n in sorted(self.states.items()))
        return (
            f"{name}: steady after {self.seconds:.1f} s ({self.calls} calls; keys: {states}); "
            f"slowest call meanwhile {self.slowest_call_s * 1e3:.2f} ms, "
            f"{self.slowest_call_s / self.median_call_s:.1f}x the median call"
        )


def states_of(managers: list[Any]) -> dict[str, int]:
    states: dict[str, int] = {}
    for manager in managers:
        for state, count in manager.stats.summary()["background"].items():
            states[state] = states.get(state, 0) + count
    return states


def settle(
    block: Callable[[], float], calls: CallTimes, managers: list[Any], limit_s: float
) -> Settling:
    """Run ``block`` until no key of ``managers`` may change, timing every call."""
    calls.on = True
    calls.seconds.clear()
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        block()
        if not any(state in UNSETTLED for state in states_of(managers)):
            break
    seconds = time.perf_counter() - started
    calls.on = False
    times = calls.seconds
    return Settling(
        seconds,
        len(times),
        max(times, default=0.0),
        statistics.median(times) if times else 1.0,
        states_of(managers),
    )
