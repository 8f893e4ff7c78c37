"""The devices: each names its runtime and its platform once; their modules load on first use.

A runtime (``base.DeviceRuntime``) is how the device captures, stages and replays a graph; a
platform (``platform.Platform``) answers what pays on it (the tuning the passes and the capture
ask). A new device is one row here.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class Device(NamedTuple):
    runtime: str
    """``module:Class`` of its runtime."""
    platform: str
    """``module:Class`` of its platform."""


DEVICES: dict[str, Device] = {
    "cpu": Device(
        "npugraph_ex.runtime.cpu:CpuRuntime", "npugraph_ex.runtime.cpu.platform:CpuPlatform"
    ),
    "cuda": Device("npugraph_ex.runtime.cuda:CudaRuntime", "npugraph_ex.runtime.cuda:CudaPlatform"),
    "npu": Device("npugraph_ex.runtime.npu:NpuRuntime", "npugraph_ex.runtime.npu:NpuPlatform"),
}


def loaded(path: str) -> Any:
    """The class ``module:Class`` names, its module imported."""
    module_name, _, class_name = path.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
