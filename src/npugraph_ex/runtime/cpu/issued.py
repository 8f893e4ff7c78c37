"""Stream blocks that start with collectives: issued in place, finished at their join.

A functional collective returns at once; the process group's own threads carry it while the
caller goes on. So a block whose first kernels are collectives (``all_reduce`` of a partial sum,
then ``copy_`` of the result into the graph's memory: what ``dist.all_reduce(y)`` in a
``stream("comm")`` block records) needs no worker thread of its own:

    submit:  issue the collectives (the head: every kernel up to the last collective)
    join:    wait for them, copy their results out, run the rest of the block (the tail)

Handing such a block to a worker would add a thread switch each way and overlap nothing more.
A block with other work before a collective has no such split and runs on a worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npugraph_ex.runtime.cpu.program import straight_line
from npugraph_ex.runtime.cpu.steps import CollectiveCopy, Step
from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT, host_effect

SCOPE_EDGES = (host_effect(SCOPE_ENTER), host_effect(SCOPE_EXIT))


def split_at_collectives(steps: Sequence[Step]) -> tuple[list[Step], list[Step]] | None:
    """(head, tail): the collectives, up to the last; the rest. None where there is no
    collective or other work comes first.

    The block's scope edges are left out: a stream block's edges do nothing on CPU (core limits
    are refused inside stream blocks), and issued on the main path, its exit would come after
    edges of the main path's own scopes and undo theirs."""
    steps = [step for step in steps if step[0] not in SCOPE_EDGES]
    collectives = [i for i, (fn, _, _) in enumerate(steps) if isinstance(fn, CollectiveCopy)]
    if not collectives or collectives != list(range(len(collectives))):
        return None
    return steps[: len(collectives)], steps[len(collectives) :]


class IssuedBlock:
    """One such block: ``issue`` at its submission, ``finish`` at its join (same thread)."""

    def __init__(self, head: Sequence[Step], tail: Sequence[Step]):
        self.head = list(head)
        self.tail = straight_line(tail)
        self.pending: list[tuple[CollectiveCopy, Any, Any]] = []

    def issue(self) -> None:
        for fn, args, kwargs in self.head:
            self.pending.append((fn, args[0], fn.issue(*args, **kwargs)))

    def finish(self) -> None:
        pending, self.pending = self.pending, []
        for fn, targets, results in pending:
            fn.finish(targets, results)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            self.tail()
