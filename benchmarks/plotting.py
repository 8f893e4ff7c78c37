"""Bar charts of interleaved timings: one panel per workload, one bar per variant.

The charts are drawn by ``npugraph_ex.bench.plotting`` (shared with ``npugraph-ex bench``); this
module re-exports it for the scripts and says where each chart went.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npugraph_ex.bench import plotting
from npugraph_ex.bench.plotting import PALETTE, Panel, draw_panel, quartiles

__all__ = ["PALETTE", "Panel", "bar_panels", "draw_panel", "quartiles"]


def bar_panels(panels: Sequence[Panel], path: Path, *, title: str, unit: str, ylabel: str) -> None:
    """Write a PNG with one bar panel per workload side by side, and say where."""
    written = plotting.bar_panels(panels, path, title=title, unit=unit, ylabel=ylabel)
    print(f"wrote {written}")
