"""Debugging aids any stage may import; ``npugraph_ex.debug.bisect`` and
``npugraph_ex.debug.compare_dumps`` are the accuracy tools (loaded on first use)."""

from __future__ import annotations

from typing import Any

__all__ = ["bisect", "compare_dumps"]


def __getattr__(name: str) -> Any:
    if name == "bisect":
        from npugraph_ex.debug.bisection import bisect

        return bisect
    if name == "compare_dumps":
        from npugraph_ex.debug.compare import compare_dumps

        return compare_dumps
    raise AttributeError(f"module 'npugraph_ex.debug' has no attribute {name!r}")
