"""Ranges in ``torch.profiler`` traces around what a capture manager does.

    with torch.profiler.profile() as prof:
        compiled(x)          # -> "npugraph_ex.capture graph[0/0] key0: shapes=[...]" range
        compiled(x)          # -> "npugraph_ex.replay graph[0/0] key0: shapes=[...]" range

A range costs a dispatcher call to open and close, a fair share of a small replay, so one is
opened only while a profiler records.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

NO_RANGE = contextlib.nullcontext()


def profiled(what: str, graph: str, key: str) -> AbstractContextManager[object]:
    """A range named ``npugraph_ex.<what> <graph> <key>`` while a profiler records, else none."""
    if not torch.autograd._profiler_enabled():
        return NO_RANGE
    return torch.profiler.record_function(f"npugraph_ex.{what} {graph} {key}")
