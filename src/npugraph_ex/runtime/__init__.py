"""Device runtimes behind one interface (``base.DeviceRuntime``); device modules load lazily."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

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


def graph_pool_handle(device: str | torch.device = "cpu") -> Any:
    """A new memory pool for graphs on ``device``, to share through ``use_graph_pool``.

    On CUDA it is ``torch.cuda.graph_pool_handle()``; on CPU a ``CpuPool``. Graphs compiled with
    ``options={"use_graph_pool": handle}`` (prefill and decode, two models) draw from one pool.
    """
    return runtime_for(torch.device(device).type).new_pool()


__all__ = ["CapturedGraph", "DeviceRuntime", "graph_pool_handle", "runtime_for"]
