"""The CPU device runtime: capture into a ``CpuGraph``, pools, warm-up (``base.DeviceRuntime``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.runtime.base import Capture, DeviceRuntime, Program, as_output_list
from npugraph_ex.runtime.cpu.build import Build, build_replay
from npugraph_ex.runtime.cpu.forked import FORKED_CHILDREN
from npugraph_ex.runtime.cpu.graph import CpuGraph, caller_aliases
from npugraph_ex.runtime.cpu.heap import release_free_heap
from npugraph_ex.runtime.cpu.host_answers import HOST_ANSWERS
from npugraph_ex.runtime.cpu.kernels import CompiledKernelCall
from npugraph_ex.runtime.cpu.pool import CpuPool
from npugraph_ex.runtime.cpu.recorder import KernelRecorder
from npugraph_ex.runtime.cpu.release import Releaser, ReleasingRun
from npugraph_ex.runtime.watched import WatchedRun


class CpuRuntime(DeviceRuntime):
    name = "cpu"

    def warms_up(self, kind: str) -> bool:
        # Compiled kernels are called, not recorded: their capture is their first run.
        return kind != "kernels"

    def loading_facts(self) -> contextlib.AbstractContextManager[dict[Any, Any]]:
        return HOST_ANSWERS.recording()  # what a first load would find out (``host_answers``)

    def prepare_kernel_loading(self, facts: dict[Any, Any]) -> None:
        HOST_ANSWERS.take(facts)

    def limits_cores(self) -> bool:
        return True  # the replay engine re-issues the scope's edges: intra-op threads

    def replays_watched(self) -> bool:
        return True

    def warmup(self, fn: Callable[..., Any], args: Sequence[Any], iters: int) -> None:
        with torch.no_grad():
            for _ in range(iters):
                fn(*args)

    def capture(
        self, program: Program, args: Sequence[Any], pool: Any, owned_inputs: Sequence[int] = ()
    ) -> Capture:
        FORKED_CHILDREN.ran_parallel()
        if program.kind == "kernels":
            # Compiled kernels fuse ops into loops no dispatch mode sees: the call is the replay.
            call = CompiledKernelCall(program.fn, args)
            return Capture(call, call.replay())
        pooled = "place" not in program.disabled_steps
        recorder = KernelRecorder()
        run = program.fn
        watcher = None
        if program.kind == "watched":
            watcher = run = WatchedRun(program.fn, clock=recorder.steps.__len__)
        elif pooled and isinstance(run, torch.fx.GraphModule):
            recorder.releaser = Releaser()
            run = ReleasingRun(run, recorder.releaser).run
        with torch.no_grad(), recorder:
            outputs = as_output_list(run(*args))
        if not pooled:
            pool = None
        elif pool is None:
            pool = self.new_pool()
        build = Build(
            recorder,
            outputs,
            inputs=[a for i, a in enumerate(args) if i not in owned_inputs],
            owned_inputs=[args[i] for i in owned_inputs],
            pool=pool,
            watched=watcher.points if watcher is not None else (),
        )
        graph = CpuGraph(build_replay(build, program.disabled_steps))
        del build, recorder, watcher  # the capture's own storages, now moved into the pool
        release_free_heap()
        if graph.placed is not None:
            with graph.placed.pool.lock:
                graph.placed.handing_out()
        return Capture(graph, caller_aliases(outputs))

    def new_pool(self) -> CpuPool:
        return CpuPool()

    def accepts_pool(self, pool: Any) -> bool:
        return isinstance(pool, CpuPool)

    def pool_bytes(self, pool: Any) -> int:
        return pool.nbytes

    def pool_lock(self, pool: Any) -> threading.RLock:
        return pool.lock if isinstance(pool, CpuPool) else super().pool_lock(pool)
