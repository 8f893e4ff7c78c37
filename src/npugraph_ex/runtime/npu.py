"""Ascend NPU runtime on ``torch.npu.NPUGraph``, through ``torch_npu``.

``torch_npu`` mirrors the CUDA graph API (``NPUGraph``, ``torch.npu.graph``,
``graph_pool_handle``, streams), so this runtime is the CUDA one pointed at ``torch.npu``. It is
imported only when a graph lives on an ``npu`` device.
"""

from __future__ import annotations

import importlib

from npugraph_ex.runtime.cuda import StreamGraphRuntime
from npugraph_ex.runtime.platform import Platform


class NpuRuntime(StreamGraphRuntime):
    name = "npu"

    def __init__(self) -> None:
        importlib.import_module("torch_npu")
        import torch

        super().__init__(torch.npu, torch.npu.NPUGraph, torch.npu.graph)


class NpuPlatform(Platform):
    """The fused kernels ``torch_npu`` registers (under ``PrivateUse1``); every other answer the
    default. Asking imports nothing of ``torch_npu``."""

    device_type = "npu"
    dispatch_key = "PrivateUse1"

    def fused_kernels(self) -> frozenset[str]:
        return self.kernels_present()
