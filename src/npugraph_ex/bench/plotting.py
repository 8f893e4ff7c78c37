"""Bar charts of interleaved timings: one panel per workload, one bar per variant.

Each bar is the median of the repeats, its whiskers the interquartile range (25th to 75th
percentile), and its label the median and the speed-up over the first variant (the baseline).
matplotlib is imported only when a chart is drawn: it is an optional dependency (``bench``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PALETTE = (
    "#8c8c8c",
    "#1f77b4",
    "#9ecae1",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
)
"""Bar colours in variant order, one per variant; the first (grey) is the baseline's."""

LONG_LABELS = 32
"""Bar labels longer than this in total are slanted so that neighbours do not overlap."""


@dataclass
class Panel:
    """One workload: its title and each variant's per-repeat times (first variant = baseline)."""

    title: str
    times: dict[str, Sequence[float]]
    colours: dict[str, str] | None = None
    """A colour per variant, so one variant looks the same in every panel; else by position."""


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """The 25th, 50th and 75th percentiles (linear interpolation)."""
    ordered = sorted(values)

    def at(q: float) -> float:
        pos = q * (len(ordered) - 1)
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    return at(0.25), at(0.5), at(0.75)


SHORT_BAR = 0.25
"""Bars below this fraction of the panel's height are labelled above, not inside."""


def draw_panel(ax: Any, panel: Panel, unit: str, ylabel: str) -> None:
    """Bars with interquartile whiskers on the matplotlib axes ``ax``, labelled in ``unit``."""
    names = list(panel.times)
    q = [quartiles(panel.times[n]) for n in names]
    mids = [mid for _, mid, _ in q]
    low = [mid - q1 for q1, mid, _ in q]
    high = [q3 - mid for _, mid, q3 in q]
    colours = [(panel.colours or {}).get(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)]
    error_kw = {"elinewidth": 1, "ecolor": "#333333", "capsize": 4}
    bars = ax.bar(names, mids, color=colours, yerr=[low, high], error_kw=error_kw)
    top = max(m + h for m, h in zip(mids, high, strict=True))
    for bar, mid, above in zip(bars, mids, high, strict=True):
        # A bar too short for its label gets the label above its whisker, not over the bar.
        short = mid < top * SHORT_BAR
        ax.text(
            bar.get_x() + bar.get_width() / 2,
            mid + above + top * 0.02 if short else mid / 2,
            f"{mid:.2f} {unit}\n{mids[0] / mid:.2f}x",
            ha="center",
            va="bottom" if short else "center",
            fontsize=9,
            color="black",
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.8, "lw": 0},
        )
    ax.set_ylim(0, top * 1.08)
    ax.set_title(panel.title, fontsize=10)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if sum(len(n) for n in names) > LONG_LABELS:
        for label in ax.get_xticklabels():
            label.set_rotation(25)
            label.set_horizontalalignment("right")


def bar_panels(panels: Sequence[Panel], path: Path, *, title: str, unit: str, ylabel: str) -> Path:
    """Write a PNG with one bar panel per workload side by side; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = sum(max(4.4, 0.95 * len(panel.times)) for panel in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(width, 7.0), 5.0), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        draw_panel(ax, panel, unit, ylabel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
