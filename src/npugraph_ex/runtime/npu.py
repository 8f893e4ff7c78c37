"""Ascend NPU runtime on ``torch.npu.NPUGraph``, through ``torch_npu``.

``torch_npu`` mirrors the CUDA graph API (``NPUGraph``, ``torch.npu.graph``,
``graph_pool_handle``, streams), so this runtime is the CUDA one pointed at ``torch.npu``. It is
imported only when a graph lives on an ``npu`` device.
"""

from __future__ import annotations

import importlib

from npugraph_ex.runtime.cuda import StreamGraphRuntime


class NpuRuntime(StreamGraphRuntime):
    name = "npu"

    def __init__(self) -> None:
        importlib.import_module("torch_npu")
        import torch

        super().__init__(torch.npu, torch.npu.NPUGraph, torch.npu.graph)
