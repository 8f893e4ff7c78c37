"""Whether this host gains from splitting few-row products over its threads: measured, once.

The split (``row_products``) pays where ATen's ``mm`` leaves threads idle or runs an
unvectorised kernel on one row, as MKL does on the AMD CPU the split was measured on (2x to 3x
per product). Where the BLAS already streams a weight at the memory's pace on every core, the
split buys nothing and adds a reshape. Which of the two a host is, no version check or CPU name
tells reliably; a measurement does. Once per process and thread count, at the first compile
that could split a product: ``PROBE_WEIGHTS`` one-row products by weights larger than the CPU
caches, run as ``mm`` and as the split ``bmm``, interleaved; the split stays on only where it is
at least ``MIN_GAIN`` times faster (fastest of ``PROBE_REPEATS`` rounds each). About 50 ms on
the reference machine.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import torch

log = logging.getLogger("npugraph_ex")

PROBE_WEIGHTS = 8
PROBE_SHAPE = (1024, 512)
"""Each probe weight: 2 MiB of float32; eight of them (16 MiB) stream from memory, as the layers
of a model larger than the caches do."""
PROBE_REPEATS = 7
MIN_GAIN = 1.1


@dataclass(frozen=True)
class SplitProbe:
    threads: int
    mm_ms: float
    split_ms: float

    @property
    def gain(self) -> float:
        """How many times faster the split ran (0 where nothing was timed)."""
        return self.mm_ms / self.split_ms if self.split_ms else 0.0

    @property
    def pays(self) -> bool:
        return self.gain >= MIN_GAIN


def split_pays() -> bool:
    """Whether few-row products should be split on this host, at the current thread count."""
    return probe(torch.get_num_threads()).pays


@functools.cache
def probe(threads: int) -> SplitProbe:
    """Time ``mm`` against the split on this host with ``threads`` intra-op threads."""
    if threads < 2:
        return SplitProbe(threads, 0.0, 0.0)  # nothing to split over; never reported as paying
    rows, depth = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(rows, depth, generator=generator) for _ in range(PROBE_WEIGHTS)]
    x = torch.randn(1, depth, generator=generator)
    columns = x.t().unsqueeze(0).expand(threads, depth, 1)
    blocks = [w.view(threads, rows // threads, depth) for w in weights]
    outputs = [torch.empty(1, rows) for _ in weights]
    split_outputs = [torch.empty(threads, rows // threads, 1) for _ in weights]

    def with_mm() -> None:
        for w, out in zip(weights, outputs, strict=True):
            torch.mm(x, w.t(), out=out)

    def with_split() -> None:
        for block, out in zip(blocks, split_outputs, strict=True):
            torch.bmm(block, columns, out=out)

    times: dict[str, list[float]] = {"mm": [], "split": []}
    with torch.no_grad():
        for _ in range(PROBE_REPEATS + 1):  # the first round warms up
            for name, run in (("mm", with_mm), ("split", with_split)):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    # The fastest round: what the host can do; another process competing for the cores slows
    # some rounds (a split's threads wait for each other), not all.
    mm_ms, split_ms = (min(times[name][1:]) * 1e3 for name in ("mm", "split"))
    result = SplitProbe(threads, mm_ms, split_ms)
    log.info(
        "npugraph_ex: one-row products over %d threads: mm %.3f ms, split %.3f ms (%.2fx): %s",
        threads,
        mm_ms,
        split_ms,
        result.gain,
        "splitting them" if result.pays else "leaving them to mm",
    )
    return result
