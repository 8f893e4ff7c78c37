"""Device runtimes behind one interface (``base.DeviceRuntime``); device modules load lazily."""

from __future__ import annotations

import functools
import importlib

from npugraph_ex.errors import ConfigError
from npugraph_ex.runtime.base import CapturedGraph, DeviceRuntime

RUNTIME_CLASSES = {
    "cpu": ("npugraph_ex.runtime.cpu", "CpuRuntime"),
    "cuda": ("npugraph_ex.runtime.cuda", "CudaRuntime"),
    "npu": ("npugraph_ex.runtime.npu", "NpuRuntime"),
}


@functools.cache
def runtime_for(device_type: str) -> DeviceRuntime:
    """The runtime that captures graphs on ``device_type`` (one shared instance per type)."""
    if device_type not in RUNTIME_CLASSES:
        supported = ", ".join(sorted(RUNTIME_CLASSES))
        raise ConfigError(
            f"no graph runtime for device type {device_type!r}; supported: {supported}"
        )
    module_name, class_name = RUNTIME_CLASSES[device_type]
    return getattr(importlib.import_module(module_name), class_name)()


__all__ = ["CapturedGraph", "DeviceRuntime", "runtime_for"]
