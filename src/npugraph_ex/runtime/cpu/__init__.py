"""The CPU replay engine: a device graph for a device that has none (``graph``), its runtime."""

from npugraph_ex.runtime.cpu.runtime import CpuRuntime

__all__ = ["CpuRuntime"]
