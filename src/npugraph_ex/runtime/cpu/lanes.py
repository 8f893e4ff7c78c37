"""Stream blocks on the CPU: each tag's blocks run on a worker thread beside the main path.

At capture, the recorder notes the block each step belongs to (``LaneTracker``); the graph's
``stream_join`` ops (``passes.plan_streams``) become steps too. A replay then runs:

    main:      step, step, submit(block 0), step, step, join(block 0), step, ...
    "comm":              [block 0's steps ............]

- submitting a block hands its steps, as one generated function, to its tag's worker (one thread
  per tag, shared by every graph; a tag's blocks run in the order they were submitted;
  ``workers``);
- a join on the main path waits for that block, or runs it itself if no worker has started it
  yet (and re-raises what it raised);
- a join inside a block makes the block wait for the joined one before it starts;
- the replay waits for every block before it returns, whatever happened.

The main path submits a block only after every step before it ran, so a block sees all it reads
from the main path. Memory is safe because every tensor a block touches is an argument of its
join, so the memory plan keeps it from the block's first step to the join: no concurrent step can
reuse its bytes. A capture without joins (no stream blocks, or ``plan_streams`` off) runs every
step in program order, as does a watched replay (tensor dumps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npugraph_ex.runtime.cpu.issued import IssuedBlock, split_at_collectives
from npugraph_ex.runtime.cpu.program import straight_line
from npugraph_ex.runtime.cpu.steps import Step
from npugraph_ex.runtime.cpu.workers import BlockTask, worker
from npugraph_ex.scope.events import STREAM_JOIN
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT, STREAM_LABEL

Lane = int | None
"""The stream block a step runs in (its number), or None for the main path."""


class LaneTracker:
    """Follows the scope ops a capture runs, to tell which block each kernel belongs to: the
    innermost stream block open around it (``plan_streams`` leaves no block inside another; a
    graph it did not plan runs in program order anyway)."""

    def __init__(self) -> None:
        self.open: list[Lane] = []
        self.tags: dict[int, str] = {}
        """The tag of each block, by number."""

    @property
    def current(self) -> Lane:
        return self.open[-1] if self.open else None

    def lane_of(self, op: Any, args: tuple, kwargs: dict) -> Lane:
        """The lane of a call to ``op``; opening and closing scopes as the graph does."""
        if op is SCOPE_ENTER:
            keys, values = list(args[0]), list(args[1])
            lane = self.current
            if STREAM_LABEL in keys:
                lane = len(self.tags)
                self.tags[lane] = values[keys.index(STREAM_LABEL)]
            self.open.append(lane)
            return lane
        lane = self.current
        if op is SCOPE_EXIT and self.open:
            self.open.pop()
        return lane


def wait_nothing(block: int, touched: Sequence[torch.Tensor]) -> None:
    """A join run in program order: every block before it is already done."""


def join_step(block: int, touched: Sequence[torch.Tensor]) -> Step:
    return wait_nothing, (block, touched), {}


def is_join(op: Any) -> bool:
    return op is STREAM_JOIN


def block_ends(steps: Sequence[Step], lanes: Sequence[Lane]) -> dict[int, int]:
    """For each block, the index of the main-path step by which it is surely finished: its own
    join there, or the main join of a block that waits for it, whichever comes last (the last
    step when nothing joins it before the end)."""
    main_join: dict[int, int] = {}
    waiters: dict[int, list[int]] = {}
    for index, ((fn, args, _), lane) in enumerate(zip(steps, lanes, strict=True)):
        if fn is not wait_nothing:
            continue
        if lane is None:
            main_join.setdefault(args[0], index)
        else:
            waiters.setdefault(args[0], []).append(lane)
    last = len(steps) - 1

    def end(block: int) -> int:
        return max([main_join.get(block, last), *(end(w) for w in waiters.get(block, ()))])

    return {block: end(block) for block in {lane for lane in lanes if lane is not None}}


def keep_block_memory(steps: Sequence[Step], lanes: Sequence[Lane], step_tensors: list) -> None:
    """Make every tensor a block's steps touch live until the block is surely finished (in the
    memory plan's eyes: ``step_tensors[i]``, the tensors of step ``i``), so no step that may run
    beside the block shares its bytes."""
    ends = block_ends(steps, lanes)
    kept: dict[int, list[torch.Tensor]] = {}
    for index, lane in enumerate(lanes):
        if lane is not None:
            kept.setdefault(ends[lane], []).extend(step_tensors[index])
    for end, tensors in kept.items():
        step_tensors[end] = [*step_tensors[end], *tensors]


class LaneReplay:
    """The replay of a capture whose steps run on several lanes.

    A tag whose every block starts with its collectives gets no worker: its blocks are issued in
    place and finished at their joins (``issued``), in the order they were issued.
    """

    def __init__(self, steps: Sequence[Step], lanes: Sequence[Lane], tags: dict[int, str]):
        self.tags = tags
        self.tasks: dict[int, BlockTask] = {}
        """The worker blocks submitted in this replay and not joined by the main path yet."""
        self.last_of_tag: dict[str, BlockTask] = {}
        self.issued: dict[str, list[int]] = {}
        """Per tag, the blocks issued in place and not finished yet, in order."""
        self.block_waits: dict[int, list[int]] = {}
        main: list[Step] = []
        block_steps: dict[int, list[Step]] = {}
        for step, lane in zip(steps, lanes, strict=True):
            joined = step[1][0] if step[0] is wait_nothing else None
            if lane is None:
                main.append((self.join, (joined,), {}) if joined is not None else step)
                continue
            if lane not in block_steps:
                block_steps[lane] = []
                self.block_waits[lane] = []
                main.append((self.start, (lane,), {}))
            if joined is not None:
                self.block_waits[lane].append(joined)
            else:
                block_steps[lane].append(step)
        splits = {lane: split_at_collectives(found) for lane, found in block_steps.items()}
        on_workers = {tags[lane] for lane, split in splits.items() if split is None}
        self.in_place = {
            lane: IssuedBlock(*split)
            for lane, split in splits.items()
            if split is not None and tags[lane] not in on_workers
        }
        self.blocks = {
            lane: straight_line(found)
            for lane, found in block_steps.items()
            if lane not in self.in_place
        }
        self.run_main = straight_line(main)

    def start(self, block: int) -> None:
        for waited in self.block_waits[block]:
            if block in self.in_place or waited in self.in_place:
                self.join(waited)  # collectives and in-place blocks wait here, first
        if block in self.in_place:
            self.in_place[block].issue()
            self.issued.setdefault(self.tags[block], []).append(block)
            return
        tag = self.tags[block]
        after = [self.tasks[b] for b in self.block_waits[block] if b in self.tasks]
        task = BlockTask(
            self.blocks[block], self.last_of_tag.get(tag), after, torch.get_num_threads()
        )
        self.tasks[block] = self.last_of_tag[tag] = task
        worker(tag).submit(task)

    def join(self, block: int) -> None:
        if block in self.in_place:
            order = self.issued.get(self.tags[block], [])
            while block in order:  # a tag's blocks finish in the order they were issued
                self.in_place[order.pop(0)].finish()
            return
        task = self.tasks.pop(block, None)
        if task is not None:
            task.wait()

    def __call__(self) -> None:
        try:
            self.run_main()
        finally:
            for order in list(self.issued.values()):
                for block in list(order):
                    self.join(block)
            pending = list(self.tasks.values())
            self.tasks, self.last_of_tag = {}, {}
            for task in pending:
                task.finish()  # every block, before the first error is raised
            for task in pending:
                task.wait()
