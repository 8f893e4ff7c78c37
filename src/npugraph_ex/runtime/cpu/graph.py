"""The CPU replay engine: a device graph for a device that has none.

Capture runs the graph once under a dispatch mode that sees every ATen kernel with the exact
tensors it reads and writes, and keeps every tensor object it produces (their storages are
told apart by identity, and their bytes freed once dead: ``release``). The storages the
kernels allocated then move into a pool, where tensors that are never live together share bytes
(``memory``, ``pool``). Replay re-issues the
planned steps (see ``steps``) into that memory: no allocation for kernels with an ``out=``
overload, no view recomputation, no FX interpretation: one generated function below autograd
(``program``). Steps whose results depend on the key's sizes alone ran at capture and are
not replayed (``constants``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._ops import OpOverload

from npugraph_ex.runtime.base import CapturedGraph
from npugraph_ex.runtime.cpu.bindings import fastest_call
from npugraph_ex.runtime.cpu.constants import Constants
from npugraph_ex.runtime.cpu.lanes import (
    LaneProgram,
    keep_block_memory,
)
from npugraph_ex.runtime.cpu.memory import MemoryPlan, plan_memory, storage_keys, tensors_in
from npugraph_ex.runtime.cpu.pool import CpuPool
from npugraph_ex.runtime.cpu.program import steps_of, straight_line
from npugraph_ex.runtime.cpu.recorder import KernelRecorder
from npugraph_ex.runtime.cpu.steps import Step
from npugraph_ex.runtime.cpu.views import share_equal_views
from npugraph_ex.runtime.watched import WatchPoint


class CpuGraph(CapturedGraph):
    """The recorded steps of one capture, with the memory they write.

    With a pool, the storages the capture allocated are moved into it (see ``memory`` and
    ``pool``); without one each keeps the storage it was captured in.
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
        """The steps as one generated function (``program``), or, with stream blocks
        planned, as a main path handing blocks to workers (``lanes``): what a replay
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
        """Bytes of the constant steps' results a replay reads (``constants``), kept for
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
