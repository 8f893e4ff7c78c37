"""Interleaved timing: every ratio comes from one process and one loop.

Each repeat runs one timed block of every variant in turn (A, B, C, A, B, C, ...), so drift in
clock speed, cache state or neighbouring load hits all variants alike. A variant's figure is the
median of its repeats; the raw per-repeat times go to the JSON record so the spread can be
checked.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

Block = Callable[[], float]
"""Runs one timed block of a variant and returns the seconds it measured (per call or whole)."""


def time_calls(fn: Callable[[], Any], calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def interleaved(
    blocks: dict[str, Block],
    repeats: int,
    *,
    warmup: int = 1,
    after_round: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Run every block once per repeat; return its times by variant. Each timed round starts
    with the next block (round 0 in the given order, round 1 from the second block, ...): on a
    2-core host the block timed last in every round read up to 10% faster than an identical one
    (``docs/notes/products-through-onednn.md``).

    ``warmup`` untimed rounds in the given order come first. ``after_round`` (progress reporting)
    runs between rounds, outside every timed block.
    """
    for _ in range(warmup):
        for block in blocks.values():
            block()
        if after_round is not None:
            after_round()
    times: dict[str, list[float]] = {name: [] for name in blocks}
    order = list(blocks.items())
    for round_ in range(repeats):
        shift = round_ % len(order)
        for name, block in order[shift:] + order[:shift]:
            times[name].append(block())
        if after_round is not None:
            after_round()
    return times


def synchronizer(device: str) -> Callable[[], None]:
    """What to call before reading a clock: GPU work is queued, so a clock read alone lies."""
    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def spread(values: Sequence[float]) -> float:
    """Relative spread of repeats: (max - min) / median."""
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


def scaled(values: Sequence[float], factor: float, digits: int = 4) -> list[float]:
    """``values`` times ``factor``, rounded for the JSON record."""
    return [round(v * factor, digits) for v in values]
