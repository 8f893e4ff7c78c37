"""The CPU replay engine: a device graph for a device that has none.

Capture runs the graph once under a dispatch mode that sees every ATen kernel with the exact
tensors it reads and writes, and keeps every tensor object it produces (their storages are
told apart by identity, and their bytes freed once dead: ``cpu_release``). The storages the
kernels allocated then move into a pool, where tensors that are never live together share bytes
(``cpu_memory``, ``cpu_pool``). Replay re-issues the
planned steps (see ``cpu_steps``) into that memory: no allocation for kernels with an ``out=``
overload, no view recomputation, no FX interpretation: one generated function below autograd
(``cpu_program``). Steps whose results depend on the key's sizes alone ran at capture and are
not replayed (``cpu_constants``).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

from npugraph_ex.errors import CaptureError
from npugraph_ex.runtime.base import CapturedGraph, DeviceRuntime, as_output_list
from npugraph_ex.runtime.cpu_bindings import fastest_call
from npugraph_ex.runtime.cpu_constants import Constants
from npugraph_ex.runtime.cpu_heap import release_free_heap
from npugraph_ex.runtime.cpu_kernels import CompiledKernelCall
from npugraph_ex.runtime.cpu_lanes import (
    Lane,
    LaneProgram,
    LaneTracker,
    is_join,
    join_step,
    keep_block_memory,
)
from npugraph_ex.runtime.cpu_memory import MemoryPlan, plan_memory, storage_keys, tensors_in
from npugraph_ex.runtime.cpu_pool import CpuPool
from npugraph_ex.runtime.cpu_program import steps_of, straight_line
from npugraph_ex.runtime.cpu_release import Releaser, ReleasingRun, allocated_storages
from npugraph_ex.runtime.cpu_steps import SYNCHRONOUS_NAMESPACES, Step, plan_step
from npugraph_ex.runtime.cpu_views import share_equal_views
from npugraph_ex.runtime.watched import WatchedRun, WatchPoint

WITH_EFFECTS = torch.ops.higher_order.with_effects


class KernelRecorder(TorchDispatchMode):
    """Runs kernels normally and records, for each, the step that recomputes it in place.

    Of the higher-order ops, only ``with_effects`` reaches a graph that is captured (AOTAutograd
    wraps ops with side effects in it, such as linalg's error checks): its op is recorded and
    always re-issued, whether or not it returns anything.
    """

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[Step] = []
        self.step_kinds: Counter[str] = Counter()
        self.produced: list[Any] = []
        self.lanes = LaneTracker()
        self.step_lanes: list[Lane] = []
        """The stream block each step runs in (None: the main path)."""
        self.allocated: set[int] = set()
        """The storages (by ``storage_key``) the kernels allocated: the ones memory planning may
        move. A view of a graph constant or an input is not one of them."""
        self.releaser: Releaser | None = None
        """With one, the storages each kernel allocates are freed once dead (``cpu_release``)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is WITH_EFFECTS:
            return self.record_effect(*args, **kwargs)
        if not isinstance(func, OpOverload):
            raise CaptureError(f"the CPU replay engine cannot record {func}")
        lane = self.lanes.lane_of(func, args, kwargs)
        result = func(*args, **kwargs)
        planned = (
            ("join", join_step(*args)) if is_join(func) else plan_step(func, args, kwargs, result)
        )
        self.track_storages(func, args, kwargs, result)
        self.record(planned, result, lane)
        return result

    def track_storages(self, op: OpOverload, args: tuple, kwargs: dict, result: Any) -> None:
        """Note the storages ``op`` allocated, and hand them to the releaser if there is one."""
        allocated = allocated_storages(args, kwargs, result)
        self.allocated.update(key for key, _ in allocated)
        if self.releaser is not None:
            self.releaser.allocated(allocated)
            if op.namespace not in SYNCHRONOUS_NAMESPACES:
                self.releaser.pin((args, kwargs))

    def record(self, planned: tuple[str, Step] | None, result: Any, lane: Lane = None) -> None:
        if planned is not None:
            kind, step = planned
            self.steps.append(step)
            self.step_kinds[kind] += 1
            self.step_lanes.append(lane)
        # Every result stays alive for the graph's life: its address is part of the graph.
        self.produced.append(result)

    def record_effect(self, token: Any, op: OpOverload, *args: Any, **kwargs: Any) -> tuple:
        result = op(*args, **kwargs)
        planned = plan_step(op, args, kwargs, result) or ("effect", (op, args, kwargs))
        self.track_storages(op, args, kwargs, result)
        self.record(planned, result, self.lanes.current)
        new_token = torch.empty(0)
        return (new_token, *result) if isinstance(result, tuple) else (new_token, result)


class CpuGraph(CapturedGraph):
    """The recorded steps of one capture, with the memory they write.

    With a pool, the storages the capture allocated are moved into it (see ``cpu_memory`` and
    ``cpu_pool``); without one each keeps the storage it was captured in.
    """

    def __init__(
        self,
        recorder: KernelRecorder,
        outputs: list[Any],
        inputs: Any,
        pool: CpuPool | None,
        owned_inputs: Sequence[torch.Tensor] = (),
        watched: Sequence[WatchPoint] = (),
        fold_constants: bool = True,
    ):
        concurrent = recorder.step_kinds["join"] > 0
        released = recorder.releaser.released if recorder.releaser else {}
        input_keys, owned_keys = storage_keys(inputs), storage_keys(owned_inputs)
        constants = (
            Constants.of(recorder, input_keys | owned_keys | storage_keys(outputs), released)
            if fold_constants and pool is not None and not watched
            else Constants.none()
        )
        recorded = constants.others(recorder.steps)
        lanes = constants.others(recorder.step_lanes)
        steps = [
            (fastest_call(fn, args, kwargs) if isinstance(fn, OpOverload) else fn, args, kwargs)
            for fn, args, kwargs in recorded
        ]
        self.step_count = len(steps)
        self.step_names = [
            sys.intern(str(fn) if isinstance(fn, OpOverload) else fn.__qualname__)
            for fn, _, _ in recorded
        ]
        """What each step runs: its ATen overload, or ``compute_and_copy[op]``."""
        self.replay_steps = (
            LaneProgram(steps, lanes, recorder.lanes.tags) if concurrent else straight_line(steps)
        )
        """The steps as one generated function (``cpu_program``), or, with stream blocks
        planned, as a main path handing blocks to workers (``cpu_lanes``): what a replay
        calls."""
        self.step_kinds = recorder.step_kinds + Counter(constant=constants.count)
        """How many steps run through an ``out=`` overload, in place, or compute-and-copy, and
        how many ran once at capture (``constant``)."""
        self.outputs = outputs
        # Owned input buffers are planned like intermediates live from before the first step
        # (the caller's values are copied in before a replay starts).
        movable = (recorder.allocated | owned_keys) - input_keys
        # An owned input an output views stays where it is: as an output storage it would move
        # between slots, and another key's replay would take it while the key still refreshes it.
        movable -= owned_keys & storage_keys(outputs)
        movable -= constants.storages
        step_tensors = [tensors_in((a, k)) for _, a, k in steps]
        if concurrent:
            keep_block_memory(steps, lanes, step_tensors)
        for ready, _, value in watched if steps else ():
            step_tensors[max(ready - 1, 0)] += tensors_in(value)  # re-pointed with the plan
        self.watched = list(watched)
        """Each node's value and the steps after which it is complete (a watched capture)."""
        self.kept_steps = steps if concurrent or watched else None
        """The step list, kept where a replay walks it; else read back when asked (``steps``)."""
        plan = plan_memory(step_tensors, outputs, movable, owned_inputs, released)
        self.placed = pool.place(plan) if pool is not None else None
        if self.placed is not None and self.kept_steps is None:
            # The outputs' storages are the ones whose views a key switch re-points.
            share_equal_views(self.replay_steps, pool.arena, storage_keys(outputs))
        self.unplaced = None if pool is not None else recorder.produced
        """Without a pool, what keeps the capture's storages alive."""
        self._pool_bytes = self.placed.nbytes if self.placed else unpooled_bytes(plan)
        self.constant_bytes = constants.nbytes
        """Bytes of the constant steps' results a replay reads (``cpu_constants``), kept for
        this key alone; counted in ``pool_bytes``."""
        self._pool_bytes += self.constant_bytes
        self.capture_outputs = caller_aliases(outputs)

    def replay(self) -> list[Any]:
        return self.run_in_place(self.run_steps)

    def replay_watched(self, visit: Callable[[torch.fx.Node, Any], None]) -> list[Any]:
        """Replay step by step, calling ``visit(node, value)`` as soon as each watched node's
        value is complete (before a later step may reuse its memory)."""
        return self.run_in_place(lambda: self.run_steps_watched(visit))

    def run_in_place(self, run: Callable[[], None]) -> list[Any]:
        """``run()`` the steps in this capture's memory (entered in its pool, under the pool's
        lock); the outputs, for the caller."""
        if self.placed is None:
            run()
            return caller_aliases(self.outputs)
        with self.placed.pool.lock:
            self.placed.enter()
            run()
            # Aliases made under the lock: another key's replay sees them as held.
            return caller_aliases(self.outputs)

    @property
    def steps(self) -> list[Step]:
        """Every step a replay runs, in order: ``(fn, args, kwargs)``."""
        if self.kept_steps is not None:
            return self.kept_steps
        return steps_of(self.replay_steps)

    def run_steps_watched(self, visit: Callable[[torch.fx.Node, Any], None]) -> None:
        points = sorted(self.watched, key=lambda point: point[0])
        steps = self.steps
        done = 0
        for count in range(len(steps) + 1):
            while done < len(points) and points[done][0] <= count:
                visit(points[done][1], points[done][2])
                done += 1
            if count < len(steps):
                fn, args, kwargs = steps[count]
                with torch._C._AutoDispatchBelowADInplaceOrView():
                    fn(*args, **kwargs)

    def run_steps(self) -> None:
        # Below autograd: replay is inference-only and every tensor is already in place.
        with torch._C._AutoDispatchBelowADInplaceOrView():
            self.replay_steps()

    def release(self) -> None:
        if self.placed is not None:
            self.placed.leave()
        self.kept_steps = None
        self.step_count = 0
        self.replay_steps = straight_line([])
        self.step_names = []
        self.watched = []
        self.outputs = []
        self.unplaced = None
        self.constant_bytes = 0
        self._pool_bytes = 0

    @property
    def pool_bytes(self) -> int:
        return self._pool_bytes

    @property
    def kernel_count(self) -> int:
        return self.step_count


def caller_aliases(outputs: list[Any]) -> list[Any]:
    """New tensor objects over the outputs' memory, for the caller.

    The engine re-points its own tensor objects when memory moves between captures; the caller's
    objects (and views of them) must never move with them.
    """
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs]


def unpooled_bytes(plan: MemoryPlan) -> int:
    """Bytes of the storages a capture without a pool keeps (each its own allocation)."""
    return sum(b.nbytes for b in plan.intermediates) + plan.output_bytes


class CpuRuntime(DeviceRuntime):
    name = "cpu"
    capture_executes = True
    limits_cores = True
    replays_watched = True

    plan_memory = True
    """False captures without pools: every tensor keeps its own allocation (for comparisons)."""

    fold_constants = True
    """False replays every step, the constant ones too (``cpu_constants``; for comparisons)."""

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
