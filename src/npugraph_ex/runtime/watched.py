"""A run of an FX graph that keeps every node's value and when, in kernels, it was ready.

Captured this way, a CPU replay can stop after any node's kernels and read that node's outputs
(``CpuGraph.replay_watched``): what tensor dumps of replayed calls are made from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx

WatchPoint = tuple[int, torch.fx.Node, Any]
"""Kernels run before the node's value was complete, the node, its value."""


class WatchedRun:
    """Callable like the graph; runs it node by node and records a :data:`WatchPoint` per node.

    ``clock`` counts the kernels run so far (the recorder capturing the run knows).
    """

    def __init__(self, gm: torch.fx.GraphModule, clock: Callable[[], int]):
        self.gm = gm
        self.clock = clock
        self.points: list[WatchPoint] = []

    def __call__(self, *args: Any) -> Any:
        self.points = []
        return Watcher(self).run(*args)


class Watcher(torch.fx.Interpreter):
    def __init__(self, run: WatchedRun):
        super().__init__(run.gm, garbage_collect_values=False)
        self.watched = run

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if n.op != "output":
            self.watched.points.append((self.watched.clock(), n, value))
        return value
