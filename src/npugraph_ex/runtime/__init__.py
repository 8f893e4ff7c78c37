"""Device runtimes behind one interface (``base.DeviceRuntime``), one per row of ``DEVICES``
(``devices``); device modules load lazily."""

from __future__ import annotations

import functools
from typing import Any

import torch

from npugraph_ex.errors import ConfigError
from npugraph_ex.runtime.base import CapturedGraph, DeviceRuntime
from npugraph_ex.runtime.devices import DEVICES, loaded


@functools.cache
def runtime_for(device_type: str) -> DeviceRuntime:
    """The runtime that captures graphs on ``device_type`` (one shared instance per type)."""
    if device_type not in DEVICES:
        supported = ", ".join(sorted(DEVICES))
        raise ConfigError(
            f"no graph runtime for device type {device_type!r}; supported: {supported}"
        )
    return loaded(DEVICES[device_type].runtime)()


def graph_pool_handle(device: str | torch.device = "cpu") -> Any:
    """A new memory pool for graphs on ``device``, to share through ``use_graph_pool``.

    On CUDA it is ``torch.cuda.graph_pool_handle()``; on CPU a ``CpuPool``. Graphs compiled with
    ``options={"use_graph_pool": handle}`` (prefill and decode, two models) draw from one pool.
    """
    return runtime_for(torch.device(device).type).new_pool()


__all__ = ["CapturedGraph", "DeviceRuntime", "graph_pool_handle", "runtime_for"]
