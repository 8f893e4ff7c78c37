"""Markdown tables for reports: what a benchmark prints is what docs/benchmarks.md shows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table with right-aligned columns (first column left-aligned)."""
    cells = [[str(h) for h in headers]] + [[cell_text(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join(("-" * (w + 1)) + (":" if i else "-") for i, w in enumerate(widths))
    return "\n".join([line(cells[0]), rule + "|"] + [line(r) for r in cells[1:]])


def cell_text(value: Any) -> str:
    """Floats to three significant figures below 1, else two decimals (one from 100)."""
    if not isinstance(value, float):
        return str(value)
    size = abs(value)
    return f"{value:.3g}" if size < 1 else f"{value:.2f}" if size < 100 else f"{value:.1f}"
