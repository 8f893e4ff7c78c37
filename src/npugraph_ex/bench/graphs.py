"""Reading the capture managers a compiled function created: its keys, pools and graphs.

Every capture manager registers itself in ``npugraph_ex.capture.stats.LIVE_GRAPHS`` (by creation
order) for as long as its compiled function lives. A benchmark notes the numbers alive before it
compiles (``live_graph_numbers``) and reads the managers created since (``managers_since``), so
graphs of other variants in the same process are never counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from npugraph_ex.capture.stats import LIVE_GRAPHS


def live_graph_numbers() -> set[int]:
    """Numbers of the capture managers alive now (pass to ``managers_since`` later)."""
    return set(LIVE_GRAPHS.keys())


def managers_since(before: set[int]) -> list[Any]:
    """The capture managers created since ``before`` that are still alive, oldest first."""
    found = (LIVE_GRAPHS.get(n) for n in sorted(LIVE_GRAPHS.keys()) if n not in before)
    return [m for m in found if m is not None]


@dataclass(frozen=True)
class CaptureSummary:
    """What the capture managers of one compiled function hold."""

    graphs: int
    """Capture managers (one per FX graph Dynamo produced)."""
    keys: int
    """Graph keys captured and alive (one per distinct input shape)."""
    pool_bytes: int
    """Bytes their memory pools hold, from each graph's stats summary."""


def summarise(managers: Sequence[Any]) -> CaptureSummary:
    """Sum the stats summaries of ``managers``."""
    summaries = [m.stats.summary() for m in managers]
    return CaptureSummary(
        graphs=len(summaries),
        keys=sum(s["live_keys"] for s in summaries),
        pool_bytes=sum(s["pool_bytes"] for s in summaries),
    )
