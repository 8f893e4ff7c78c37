"""Leaf helpers any stage may import: log once, a node's source line, profiling ranges, graph and
tensor dumps, the compile debug folder. They import nothing above ``config``; the accuracy tools
built on the whole stack are ``npugraph_ex.tools``."""

from __future__ import annotations

MOVED = {"bisect": "npugraph_ex.tools.bisect", "compare_dumps": "npugraph_ex.tools.compare_dumps"}


def __getattr__(name: str) -> object:
    if name in MOVED:
        raise AttributeError(
            f"npugraph_ex.debug has no {name!r}: it is {MOVED[name]} "
            f"(from npugraph_ex.tools import {name})"
        )
    raise AttributeError(f"module 'npugraph_ex.debug' has no attribute {name!r}")
