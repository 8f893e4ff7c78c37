"""CUDA runtime on ``torch.cuda.CUDAGraph``.

Warm-up runs on a side stream (as capture does) so that lazily created library handles and
workspaces exist before capture; capture then records into a graph whose memory comes from the
given pool. Capturing executes nothing, so the capturing call replays once.

Stream blocks run on a side stream per tag during warm-up and capture (``SideStreams``): the
capture records them as branches of the graph, forked with an event wait and joined where
``plan_streams`` put the joins.

Pools shared by several captures: the caching allocator hands a later capture the blocks an
earlier one freed (its intermediates), so a later capture's outputs may sit in bytes an earlier
graph rewrites on every replay. Such captures therefore end with a second, tiny graph that copies
each output storage into memory of its own, outside the pool; the pool keeps intermediates only,
and one key's replay never touches another key's outputs.

A shared pool is held by an empty graph captured into it (``hold_pool``): the allocator forgets a
pool once every graph captured into it is released, and a capture into a forgotten pool's id
fails an internal assertion inside ``capture_begin`` after the random-number generators entered
capture mode, so that every later random op of the process fails.

A key's own input buffers are allocated in its graph's pool before its first capture
(``CudaRuntime.input_buffers``), once: the kernels captured later for the key read the same ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.runtime import cuda_pools
from npugraph_ex.runtime.base import (
    Capture,
    CapturedGraph,
    DeviceRuntime,
    InputBuffers,
    Program,
    as_output_list,
)
from npugraph_ex.runtime.handed_out import HandedOut
from npugraph_ex.runtime.output_copies import private_copies
from npugraph_ex.runtime.platform import Platform
from npugraph_ex.scope.router import routing


class DeviceGraph(CapturedGraph):
    """A captured CUDA or NPU graph with its static outputs (and the graph copying them out).

    The caller gets aliases of the outputs that a later replay makes unreadable (``HandedOut``).
    """

    def __init__(
        self, graphs: list[Any], outputs: list[Any], pool_bytes: int, inputs: Sequence[Any]
    ):
        self.graphs = graphs
        self.outputs = outputs
        self._pool_bytes = pool_bytes
        self.handed_out = HandedOut(inputs)

    def replay(self) -> list[Any]:
        self.handed_out.before_replay()
        for graph in self.graphs:
            graph.replay()
        return self.handed_out.hand_out(self.outputs)

    def release(self) -> None:
        for graph in self.graphs:
            graph.reset()
        self.handed_out.release(self.outputs)
        self.graphs = []
        self.outputs = []
        self._pool_bytes = 0

    @property
    def pool_bytes(self) -> int:
        return self._pool_bytes


class SideStreams:
    """Routes a graph's stream blocks to side streams while it runs (``scope.router``), so a
    capture records them as branches forked from, and joined back into, the capturing stream.

    A block's stream first waits for the stream that opens it (it sees all issued before it),
    and records an event when the block closes; a join makes the joining stream wait for that
    event. Every block is joined before the graph returns (``plan_streams``), which a capture
    requires of every stream it forked. A tag keeps its stream for the runtime's life.
    """

    def __init__(self, module: Any, streams: dict[str, Any]):
        self.module = module
        self.streams = streams
        self.opened: list[tuple[int, Any]] = []
        """The open block's number and the stream it was opened from."""
        self.blocks = 0
        self.ends: dict[int, Any] = {}
        self.events: dict[str, Any] = {}

    def enter(self, tag: str, priority: int) -> None:
        if tag not in self.streams:
            self.streams[tag] = self.module.Stream(priority=priority)
        opener = self.module.current_stream()
        side = self.streams[tag]
        side.wait_stream(opener)
        self.opened.append((self.blocks, opener))
        self.blocks += 1
        self.module.set_stream(side)

    def exit(self) -> None:
        block, opener = self.opened.pop()
        self.ends[block] = self.module.current_stream().record_event()
        self.module.set_stream(opener)

    def record(self, tag: str) -> None:
        self.events[tag] = self.module.current_stream().record_event()

    def wait(self, tag: str) -> None:
        self.module.current_stream().wait_event(self.events[tag])

    def join(self, block: int) -> None:
        self.module.current_stream().wait_event(self.ends[block])


class StreamGraphRuntime(DeviceRuntime):
    """Capture and replay through a ``torch.<device>`` module with the CUDA graph API."""

    def __init__(self, module: Any, graph_class: Any, graph_context: Any):
        self.module = module
        self.graph_class = graph_class
        self.graph_context = graph_context
        self.pool_growth: dict[Any, int] = {}
        self.pool_users: dict[Any, int] = {}
        self.side_streams: dict[str, Any] = {}
        """One side stream per stream-block tag."""

    def routed(self) -> Any:
        return routing(SideStreams(self.module, self.side_streams))

    def default_stream(self, stream_id: int) -> bool:
        return stream_id == 0  # the device's legacy default stream

    def warmup(self, fn: Callable[..., Any], args: Sequence[Any], iters: int) -> None:
        side = self.module.Stream()
        side.wait_stream(self.module.current_stream())
        with torch.no_grad(), self.module.stream(side):
            for _ in range(iters):
                with self.routed():
                    fn(*args)
        self.module.current_stream().wait_stream(side)

    def capture(
        self, program: Program, args: Sequence[Any], pool: Any, owned_inputs: Sequence[int] = ()
    ) -> Capture:
        """Any program (ATen kernels, compiled kernels; a watched one is captured as a graph).
        Capturing executes nothing, so the capturing call replays once."""
        graph = self.record(program.fn, args, pool, program.capture_error_mode)
        return Capture(graph, graph.replay())

    def record(
        self, fn: Callable[..., Any], args: Sequence[Any], pool: Any, capture_error_mode: str
    ) -> DeviceGraph:
        # pool_bytes: what the capture newly reserved (its own pool, or growth of a shared one)
        self.module.synchronize()
        # The capture's context empties the allocator's cache; measured after that, a capture
        # that reserves nothing new reads 0 rather than the cache it emptied (a negative growth).
        self.module.empty_cache()
        before = self.module.memory_reserved()
        graph = self.graph_class()
        context = self.graph_context(graph, pool=pool, capture_error_mode=capture_error_mode)
        with torch.no_grad(), context, self.routed():
            outputs = as_output_list(fn(*args))
        graphs = [graph]
        self.pool_users[pool] = self.pool_users.get(pool, 0) + 1
        # The first capture in a pool needs no copies: no graph before it freed blocks there.
        if self.pool_users[pool] > 1:
            outputs, pairs = private_copies(outputs, args)
            if pairs:  # else every output is an input's, or empty: nothing to copy out
                graphs.append(self.copier(pairs, capture_error_mode))
        self.module.synchronize()
        grown = max(self.module.memory_reserved() - before, 0)
        self.pool_growth[pool] = self.pool_growth.get(pool, 0) + grown
        return DeviceGraph(graphs, outputs, grown, args)

    def copier(self, pairs: Sequence[Any], capture_error_mode: str) -> Any:
        """A graph copying each ``(source, own)`` pair's bytes, in a pool of its own."""
        graph = self.graph_class()
        with torch.no_grad(), self.graph_context(graph, capture_error_mode=capture_error_mode):
            for source, own in pairs:
                own.copy_(source)
        return graph

    def new_pool(self) -> Any:
        return self.module.graph_pool_handle()

    def hold_pool(self, pool: Any) -> Any:
        anchor = self.graph_class()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty capture warns that it is empty
            with self.graph_context(anchor, pool=pool, capture_error_mode="thread_local"):
                pass
        return anchor

    def accepts_pool(self, pool: Any) -> bool:
        return isinstance(pool, tuple) and len(pool) == 2

    def pool_bytes(self, pool: Any) -> int:
        return self.pool_growth.get(pool, 0)

    def synchronize(self) -> None:
        self.module.synchronize()


class CudaRuntime(StreamGraphRuntime):
    """Input buffers in the graph's pool, and pool bytes read from the allocator's segments
    (``cuda_pools``)."""

    name = "cuda"

    def __init__(self) -> None:
        super().__init__(torch.cuda, torch.cuda.CUDAGraph, torch.cuda.graph)

    def input_buffers(self, sources: Sequence[torch.Tensor], pool: Any) -> InputBuffers:
        in_pool = [s.is_cuda for s in sources]
        if not any(in_pool) or pool is None or not cuda_pools.can_allocate_in_pool():
            return super().input_buffers(sources, pool)
        on_device = [s for s in sources if s.is_cuda]
        # Allocating into a pool no graph holds yet would leave it released before the
        # capture, which then fails an internal assertion: hold it first, with the buffers.
        # Pools are per device: the hold is taken on the device the buffers go to.
        with torch.cuda.device(on_device[0].device):
            hold = self.hold_pool(pool)
        pooled = iter(cuda_pools.copies_in_pool(on_device, pool))
        tensors = [
            next(pooled) if cuda else s.clone(memory_format=torch.preserve_format)
            for s, cuda in zip(sources, in_pool, strict=True)
        ]
        return InputBuffers(tensors, hold)

    def pool_bytes(self, pool: Any) -> int:
        reserved, _ = cuda_pools.pool_bytes(torch.cuda.memory_snapshot(), pool)
        return reserved


class CudaPlatform(Platform):
    """The fused kernels that pay on a GPU (written-out attention to
    ``scaled_dot_product_attention``, RMSNorm to ``aten._fused_rms_norm`` where this PyTorch has
    a CUDA kernel of it); no product rewrite (measured on CPU hosts only); keys run the graph as
    compiled."""

    device_type = "cuda"
    dispatch_key = "CUDA"

    def fused_kernels(self) -> frozenset[str]:
        return self.kernels_present()
