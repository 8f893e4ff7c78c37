"""Memory a variant takes: peak device memory on CUDA, resident-set growth on CPU.

On CUDA the caching allocator keeps a high-water mark that can be reset, so the figure is the
peak allocated over the variant's first run (weights included). On CPU there is no per-variant
high-water mark to reset in a portable way, so the figure is how much the process's resident set
grew over the variant's first run: compiled code, captured graphs and their pools. Pages freed
back to the allocator but not to the system still count, so read it as an upper bound.
"""

from __future__ import annotations

import os
import resource
import sys

import torch


def resident_bytes() -> int:
    """The resident set of this process now (/proc/self/statm), else its peak (``resource``)."""
    try:
        with open("/proc/self/statm", encoding="utf-8") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class MemoryMeter:
    """Measures one variant's memory between ``start()`` and ``stop()``."""

    def __init__(self, device: str):
        self.device = device
        self.before = 0

    def start(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self.before = resident_bytes()

    def stop(self) -> int:
        """CUDA: peak bytes allocated since ``start``; CPU: resident growth since ``start``."""
        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return max(resident_bytes() - self.before, 0)
