"""The CPU device runtime: capture into a ``CpuGraph``, pools, warm-up (``base.DeviceRuntime``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.runtime.base import DeviceRuntime, as_output_list
from npugraph_ex.runtime.cpu.graph import CpuGraph
from npugraph_ex.runtime.cpu.heap import release_free_heap
from npugraph_ex.runtime.cpu.kernels import CompiledKernelCall
from npugraph_ex.runtime.cpu.pool import CpuPool
from npugraph_ex.runtime.cpu.recorder import KernelRecorder
from npugraph_ex.runtime.cpu.release import Releaser, ReleasingRun
from npugraph_ex.runtime.watched import WatchedRun


class CpuRuntime(DeviceRuntime):
    name = "cpu"
    capture_executes = True
    limits_cores = True
    replays_watched = True

    plan_memory = True
    """False captures without pools: every tensor keeps its own allocation (for comparisons)."""

    fold_constants = True
    """False replays every step, the constant ones too (``constants``; for comparisons)."""

    def warmup(self, fn: Callable[..., Any], args: Sequence[Any], iters: int) -> None:
        with torch.no_grad():
            for _ in range(iters):
                fn(*args)

    def capture(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        *,
        pool: Any,
        capture_error_mode: str,
        owned_inputs: Sequence[int] = (),
    ) -> CpuGraph:
        recorder = KernelRecorder()
        run = fn
        if isinstance(fn, WatchedRun):
            fn.clock = recorder.steps.__len__
        elif self.plan_memory and isinstance(fn, torch.fx.GraphModule):
            recorder.releaser = Releaser()
            run = ReleasingRun(fn, recorder.releaser).run
        with torch.no_grad(), recorder:
            outputs = as_output_list(run(*args))
        if not self.plan_memory:
            pool = None
        elif pool is None:
            pool = self.new_pool()
        owned = [args[i] for i in owned_inputs]
        fixed = [a for i, a in enumerate(args) if i not in owned_inputs]
        watched = fn.points if isinstance(fn, WatchedRun) else ()
        graph = CpuGraph(recorder, outputs, fixed, pool, owned, watched, self.fold_constants)
        del recorder, outputs, watched  # the capture's own storages, now moved into the pool
        release_free_heap()
        return graph

    def capture_compiled(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        *,
        pool: Any,
        capture_error_mode: str,
        owned_inputs: Sequence[int] = (),
    ) -> CompiledKernelCall:
        return CompiledKernelCall(fn, args)

    def new_pool(self) -> CpuPool:
        return CpuPool()

    def accepts_pool(self, pool: Any) -> bool:
        return isinstance(pool, CpuPool)

    def pool_bytes(self, pool: Any) -> int:
        return pool.nbytes

    def pool_lock(self, pool: Any) -> threading.RLock:
        return pool.lock if isinstance(pool, CpuPool) else super().pool_lock(pool)
