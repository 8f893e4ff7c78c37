"""How a recorded capture becomes the program a key replays: named steps, in one order.

    fold_constants   steps that depend on the key's sizes alone ran at capture; drop them
    bind_kernels     each recorded call bound to its fastest form (``out=`` where proven)
    lanes            one generated function, or a main path handing stream blocks to workers
    plan_memory      which storages share bytes (lifetimes of the steps' tensors)
    place            intermediates into the pool's arena, outputs into its slots
    share_views      one tensor object per place the steps pass

Each step reads and extends one ``Build`` record, and the result is one ``BuiltReplay``: the key
holds it, and releasing the key drops it. Three steps can be switched off by name
(``disabled_build_steps``, for comparisons): without ``fold_constants`` every step is replayed;
without ``place`` the capture takes no pool and every storage keeps its own allocation (nothing
is freed while it runs, nothing folds); without ``share_views`` each recorded tensor object
stays its own.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._ops import OpOverload

from npugraph_ex.runtime.cpu.bindings import fastest_call
from npugraph_ex.runtime.cpu.constants import Constants
from npugraph_ex.runtime.cpu.lanes import Lane, LaneReplay, keep_block_memory
from npugraph_ex.runtime.cpu.memory import MemoryPlan, plan_memory, storage_keys
from npugraph_ex.runtime.cpu.pool import CpuPool, PlacedCapture
from npugraph_ex.runtime.cpu.program import straight_line
from npugraph_ex.runtime.cpu.recorder import KernelRecorder
from npugraph_ex.runtime.cpu.steps import Step
from npugraph_ex.runtime.cpu.views import share_equal_views
from npugraph_ex.runtime.tensors import tensors_in
from npugraph_ex.runtime.watched import WatchPoint


@dataclass
class Build:
    """A capture on its way to a program: what the recording gave, and what the steps add."""

    recorder: KernelRecorder
    outputs: list[Any]
    inputs: Sequence[Any]
    """The inputs that stay where they are (the caller's tensors, parameters)."""
    owned_inputs: Sequence[torch.Tensor]
    """The graph's own input buffers, planned like intermediates live from the first step."""
    pool: CpuPool | None
    watched: Sequence[WatchPoint] = ()
    constants: Constants = field(default_factory=Constants.none)
    recorded: list[Step] = field(default_factory=list)
    lanes: list[Lane] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    replay: Callable[[], None] = straight_line([])
    plan: MemoryPlan | None = None
    placed: PlacedCapture | None = None

    @property
    def released(self) -> dict[int, int]:
        """The size of each storage the capture freed while it ran (``release``)."""
        releaser = self.recorder.releaser
        return releaser.released if releaser else {}

    @property
    def concurrent(self) -> bool:
        return self.recorder.step_kinds["join"] > 0


def fold_constants(build: Build) -> None:
    if build.pool is None or build.watched:
        return
    fixed = storage_keys(build.inputs) | storage_keys(build.owned_inputs)
    outputs = storage_keys(build.outputs)
    build.constants = Constants.of(build.recorder, fixed | outputs, build.released)


def bind_kernels(build: Build) -> None:
    build.recorded = build.constants.others(build.recorder.steps)
    build.lanes = build.constants.others(build.recorder.step_lanes)
    build.steps = [
        (fastest_call(fn, args, kwargs) if isinstance(fn, OpOverload) else fn, args, kwargs)
        for fn, args, kwargs in build.recorded
    ]


def lanes(build: Build) -> None:
    if build.concurrent:
        build.replay = LaneReplay(build.steps, build.lanes, build.recorder.lanes.tags)
    else:
        build.replay = straight_line(build.steps)


def plan(build: Build) -> None:
    recorder = build.recorder
    input_keys, owned_keys = storage_keys(build.inputs), storage_keys(build.owned_inputs)
    movable = (recorder.allocated | owned_keys) - input_keys
    movable -= build.constants.storages
    # An owned input an output views stays where it is: as an output storage it would move
    # between slots, and another key's replay would take it while the key still refreshes it.
    movable -= owned_keys & storage_keys(build.outputs)
    step_tensors = [tensors_in((a, k)) for _, a, k in build.steps]
    if build.concurrent:
        keep_block_memory(build.steps, build.lanes, step_tensors)
    for ready, _, value in build.watched if build.steps else ():
        step_tensors[max(ready - 1, 0)] += tensors_in(value)  # re-pointed with the plan
    build.plan = plan_memory(
        step_tensors, build.outputs, movable, build.owned_inputs, build.released
    )


def place(build: Build) -> None:
    if build.pool is not None and build.plan is not None:
        build.placed = build.pool.place(build.plan)


def share_views(build: Build) -> None:
    if build.placed is None or build.concurrent or build.watched:
        return  # views are re-pointed one by one where a replay walks the step list
    # The outputs' storages are the ones whose views a key switch re-points.
    share_equal_views(build.replay, build.placed.pool.arena, storage_keys(build.outputs))


BUILD_STEPS: tuple[tuple[str, Callable[[Build], None]], ...] = (
    ("fold_constants", fold_constants),
    ("bind_kernels", bind_kernels),
    ("lanes", lanes),
    ("plan_memory", plan),
    ("place", place),
    ("share_views", share_views),
)
"""The build, in order; ``disabled_build_steps`` may skip those of ``SWITCHABLE``."""

SWITCHABLE = frozenset({"fold_constants", "place", "share_views"})
"""Steps a program is right without (the others make the replay)."""


@dataclass
class BuiltReplay:
    """What one key replays: its steps, the memory they run in, and what it reports."""

    replay: Callable[[], None]
    outputs: list[Any]
    placed: PlacedCapture | None
    step_names: list[str]
    """What each step runs: its ATen overload, or ``compute_and_copy[op]``."""
    step_kinds: Counter[str]
    """How many steps run through an ``out=`` overload, in place, or compute-and-copy, and how
    many ran once at capture (``constant``)."""
    kept_steps: list[Step] | None
    """The step list, kept where a replay walks it (stream blocks, watched values)."""
    watched: list[WatchPoint]
    """Each node's value and the steps after which it is complete (a watched capture)."""
    constant_bytes: int
    """Bytes of the constant steps' results a replay reads (``constants``), kept for this key
    alone; counted in ``pool_bytes``."""
    pool_bytes: int
    unplaced: list[Any] | None
    """Without a pool, what keeps the capture's storages alive."""


def build_replay(build: Build, disabled: frozenset[str] = frozenset()) -> BuiltReplay:
    """Run ``BUILD_STEPS`` (those not ``disabled``) on ``build``; the program they made."""
    for name, step in BUILD_STEPS:
        if name not in disabled:
            step(build)
    recorder, plan = build.recorder, build.plan
    pool_bytes = build.placed.nbytes if build.placed else unpooled_bytes(plan)
    return BuiltReplay(
        replay=build.replay,
        outputs=build.outputs,
        placed=build.placed,
        step_names=[
            sys.intern(str(fn) if isinstance(fn, OpOverload) else fn.__qualname__)
            for fn, _, _ in build.recorded
        ],
        step_kinds=recorder.step_kinds + Counter(constant=build.constants.count),
        kept_steps=build.steps if build.concurrent or build.watched else None,
        watched=list(build.watched),
        constant_bytes=build.constants.nbytes,
        pool_bytes=pool_bytes + build.constants.nbytes,
        unplaced=None if build.pool is not None else recorder.produced,
    )


def unpooled_bytes(plan: MemoryPlan | None) -> int:
    """Bytes of the storages a capture without a pool keeps (each its own allocation)."""
    if plan is None:
        return 0
    return sum(b.nbytes for b in plan.intermediates) + plan.output_bytes
