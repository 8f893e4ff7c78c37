"""Counters of every compiled FX graph, readable from Python through ``npugraph_ex.stats()``.

The process-wide sums are mirrored where PyTorch users look for a backend's counters,
``torch._dynamo.utils.counters["npugraph_ex"]``: ``captures``, ``replays``, and for each counter
kept by reason (``recaptures``, ``eager_calls``, ``failed_calls``, ``dropped_keys``) its sum and
``<name>:<reason>``. Those are never reset by ``reset_stats()`` (clear them as Dynamo's own:
``counters.clear()``).
"""

from __future__ import annotations

import itertools
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch._dynamo.utils import counters as DYNAMO_COUNTERS

from npugraph_ex.capture.tiers import TieredGraph


@dataclass
class GraphStats:
    """What one FX graph's capture manager did; what it holds now is read from it (``live``)."""

    name: str
    device: str
    live: Callable[[], dict[str, Any]] = dict
    """What the graph holds now, read from its capture manager: ``keys`` (per live key, its
    replays since the counters restarted, kernels per replay and the bytes it needs in its
    pool), ``pools`` (bytes held by each pool its keys draw from, by pool identity), the
    ``static_kernels`` and ``key_specialisation`` outcomes of its keys' programs, and with
    background compiles (``background``) how many keys are in each state of ``tiers``:
    ``aten``, ``queued``, ``pending``, ``trial``, ``kernels``, ``aten kept: <why>``, and per key
    (``kernel_tier``) where it stands and why it is not on kernels."""
    captures: int = 0
    """Keys captured (a recapture counts here too)."""
    recaptures: Counter = field(default_factory=Counter)
    """Recaptures of an existing key, by reason."""
    replays: int = 0
    dropped_keys: Counter = field(default_factory=Counter)
    """Keys released before the graph was, by reason (``parameters replaced``: freed, or given
    new memory)."""
    eager_calls: Counter = field(default_factory=Counter)
    """Calls run eagerly instead of replayed, by reason."""
    failed_calls: Counter = field(default_factory=Counter)
    """Calls that raised to the caller, by what ran: ``replay``, or the reason of the eager run
    (``capture failed``: the eager run after a failed capture raised too, as a call with an
    index out of range does). The graph stays usable."""
    failed_passes: Counter = field(default_factory=Counter)
    """Passes that raised while this graph was compiled (it went on without them)."""
    capture_seconds: float = 0.0
    """Time spent in warm-up and capture (static kernel compiles included)."""

    def replayed(self) -> None:
        self.replays += 1
        DYNAMO_COUNTERS["npugraph_ex"]["replays"] += 1

    def captured(self, recapture: str | None) -> None:
        """A new key, or a recapture of a key for the reason ``recapture``."""
        self.captures += 1
        DYNAMO_COUNTERS["npugraph_ex"]["captures"] += 1
        if recapture is not None:
            self.count(self.recaptures, "recaptures", recapture)

    def ran_eagerly(self, reason: str) -> None:
        self.count(self.eager_calls, "eager_calls", reason)

    def failed(self, reason: str) -> None:
        self.count(self.failed_calls, "failed_calls", reason)

    def dropped(self, reason: str) -> None:
        self.count(self.dropped_keys, "dropped_keys", reason)

    @staticmethod
    def count(counter: Counter, name: str, reason: str) -> None:
        """One more ``reason`` in ``counter``, mirrored in Dynamo's counters as ``name`` and
        ``name:reason``."""
        counter[reason] += 1
        mirrored = DYNAMO_COUNTERS["npugraph_ex"]
        mirrored[name] += 1
        mirrored[f"{name}:{reason}"] += 1

    def restarted(self) -> GraphStats:
        """Counters from zero, for the same graph (its failed passes stay: they happened once)."""
        return GraphStats(self.name, self.device, self.live, failed_passes=self.failed_passes)

    def summary(self) -> dict[str, Any]:
        """Counters, plus ``pool_bytes``: what the graph's pools hold now (shared pools whole)."""
        live = self.live()
        pools, keys = live.get("pools", {}), live.get("keys", {})
        return {
            "name": self.name,
            "device": self.device,
            "captures": self.captures,
            "recaptures": dict(self.recaptures),
            "replays": self.replays,
            "dropped_keys": dict(self.dropped_keys),
            "eager_calls": dict(self.eager_calls),
            "failed_calls": dict(self.failed_calls),
            "failed_passes": dict(self.failed_passes),
            "capture_seconds": round(self.capture_seconds, 6),
            "static_kernels": dict(live.get("static_kernels", {})),
            "key_specialisation": dict(live.get("key_specialisation", {})),
            "background": dict(live.get("background", {})),
            "live_keys": len(keys),
            "pool_bytes": sum(pools.values()),
            "pools": len(pools),
            "keys": keys,
        }


LIVE_GRAPHS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
"""Capture managers by creation order; each exposes ``.stats``."""

GRAPH_NUMBERS = itertools.count()
"""Sequence numbers, never reused: a number names one manager for the life of the process
(messages logged once per graph, and ``managers_since``, rely on it)."""

TOTAL_KEYS = ("captures", "replays")


def register(manager: Any) -> int:
    """Remember a capture manager for ``stats()``; returns its sequence number."""
    number = next(GRAPH_NUMBERS)
    LIVE_GRAPHS[number] = manager
    return number


def stats() -> dict[str, Any]:
    """Counters of every live compiled graph, and their totals.

    ``graphs`` holds one summary per FX graph (see ``GraphStats``); ``totals`` sums captures,
    recaptures, replays and eager calls over them, and the bytes of every distinct pool.
    """
    managers = [m for n in sorted(LIVE_GRAPHS.keys()) if (m := LIVE_GRAPHS.get(n)) is not None]
    graphs = [m.stats.summary() for m in managers]
    totals: dict[str, Any] = {key: sum(g[key] for g in graphs) for key in TOTAL_KEYS}
    totals["recaptures"] = sum(sum(g["recaptures"].values()) for g in graphs)
    totals["eager_calls"] = sum(sum(g["eager_calls"].values()) for g in graphs)
    totals["failed_calls"] = sum(sum(g["failed_calls"].values()) for g in graphs)
    totals["failed_passes"] = sum(sum(g["failed_passes"].values()) for g in graphs)
    pools: dict[int, int] = {}
    for manager in managers:
        pools.update(manager.pool_bytes())
    totals["pool_bytes"] = sum(pools.values())
    return {"graphs": graphs, "totals": totals}


def reset_stats() -> None:
    """Zero the counters of every live graph (captures stay; only the counts restart)."""
    for manager in list(LIVE_GRAPHS.values()):
        manager.restart_counts()


def key_info(entry: Any) -> dict[str, Any]:
    """What ``stats()`` shows of a live key."""
    graph = entry.graph
    info = {"replays": entry.replays, "kernels": graph.kernel_count, "pool_bytes": graph.pool_bytes}
    if isinstance(graph, TieredGraph):
        info["kernel_tier"] = graph.reason
    return info


def live_view(manager: Any) -> Callable[[], dict[str, Any]]:
    """What the manager holds now (``GraphStats.live``), without keeping it alive from its own
    stats."""
    ref = weakref.ref(manager)

    def live() -> dict[str, Any]:
        held = ref()
        if held is None:
            return {}
        entries = held.entries.values()
        keys = {entry.label: key_info(entry) for entry in entries}
        tiers = Counter(e.graph.state.value for e in entries if isinstance(e.graph, TieredGraph))
        counts = {**held.programs.counts, "background": tiers}
        return {"keys": keys, "pools": held.pool_bytes(), **counts}

    return live
