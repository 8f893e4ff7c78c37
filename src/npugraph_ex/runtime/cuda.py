"""CUDA runtime on ``torch.cuda.CUDAGraph``.

Warm-up runs on a side stream (as capture does) so that lazily created library handles and
workspaces exist before capture; capture then records into a graph whose memory comes from the
given pool. Capturing executes nothing, so the capturing call must replay once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.runtime.base import CapturedGraph, DeviceRuntime, as_output_list


class DeviceGraph(CapturedGraph):
    """A captured CUDA or NPU graph with its static outputs."""

    def __init__(self, graph: Any, outputs: list[Any], pool_bytes: int):
        self.graph = graph
        self.outputs = outputs
        self._pool_bytes = pool_bytes

    def replay(self) -> None:
        self.graph.replay()

    def release(self) -> None:
        self.graph.reset()
        self.outputs = []
        self._pool_bytes = 0

    @property
    def pool_bytes(self) -> int:
        return self._pool_bytes


class StreamGraphRuntime(DeviceRuntime):
    """Capture and replay through a ``torch.<device>`` module with the CUDA graph API."""

    capture_executes = False

    def __init__(self, module: Any, graph_class: Any, graph_context: Any):
        self.module = module
        self.graph_class = graph_class
        self.graph_context = graph_context

    def warmup(self, fn: Callable[..., Any], args: Sequence[Any], iters: int) -> None:
        side = self.module.Stream()
        side.wait_stream(self.module.current_stream())
        with torch.no_grad(), self.module.stream(side):
            for _ in range(iters):
                fn(*args)
        self.module.current_stream().wait_stream(side)

    def capture(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        *,
        pool: Any,
        capture_error_mode: str,
    ) -> DeviceGraph:
        # pool_bytes: what the capture newly reserved (its own pool, or growth of a shared one)
        self.module.synchronize()
        before = self.module.memory_reserved()
        graph = self.graph_class()
        context = self.graph_context(graph, pool=pool, capture_error_mode=capture_error_mode)
        with torch.no_grad(), context:
            outputs = as_output_list(fn(*args))
        self.module.synchronize()
        return DeviceGraph(graph, outputs, self.module.memory_reserved() - before)

    def new_pool(self) -> Any:
        return self.module.graph_pool_handle()

    def synchronize(self) -> None:
        self.module.synchronize()


class CudaRuntime(StreamGraphRuntime):
    name = "cuda"

    def __init__(self) -> None:
        super().__init__(torch.cuda, torch.cuda.CUDAGraph, torch.cuda.graph)
