"""The CPU replay engine: a device graph for a device that has none.

Capture runs the graph once under a dispatch mode that sees every ATen kernel with the exact
tensors it reads and writes, and keeps every tensor object it produces (their storages are
told apart by identity, and their bytes freed once dead: ``release``). The build (``build``)
then turns the record into one program: the storages the kernels allocated move into a pool,
where tensors that are never live together share bytes (``memory``, ``pool``), and the steps
(see ``steps``) are re-issued into that memory on replay: no allocation for kernels with an
``out=`` overload, no view recomputation, no FX interpretation: one generated function below
autograd (``program``). Steps whose results depend on the key's sizes alone ran at capture and
are not replayed (``constants``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from npugraph_ex.runtime.base import CapturedGraph
from npugraph_ex.runtime.cpu.build import BuiltReplay
from npugraph_ex.runtime.cpu.pool import PlacedCapture
from npugraph_ex.runtime.cpu.program import steps_of
from npugraph_ex.runtime.cpu.steps import Step

RELEASED = BuiltReplay(
    replay=lambda: None,
    outputs=[],
    placed=None,
    step_names=[],
    step_kinds=Counter(),
    kept_steps=None,
    watched=[],
    constant_bytes=0,
    pool_bytes=0,
    unplaced=None,
)
"""What a released graph holds: nothing."""


class CpuGraph(CapturedGraph):
    """One key's built replay (``build.BuiltReplay``) and the memory it runs in."""

    def __init__(self, program: BuiltReplay):
        self.program = program

    @property
    def outputs(self) -> list[Any]:  # type: ignore[override]
        return self.program.outputs

    @property
    def placed(self) -> PlacedCapture | None:
        return self.program.placed

    @property
    def step_names(self) -> list[str]:
        return self.program.step_names

    @property
    def step_kinds(self) -> Counter[str]:
        return self.program.step_kinds

    @property
    def constant_bytes(self) -> int:
        return self.program.constant_bytes

    @property
    def replay_steps(self) -> Callable[[], None]:
        return self.program.replay

    def replay(self) -> list[Any]:
        return self.run_in_place(self.run_steps)

    def replay_watched(self, visit: Callable[[torch.fx.Node, Any], None]) -> list[Any]:
        """Replay step by step, calling ``visit(node, value)`` as soon as each watched node's
        value is complete (before a later step may reuse its memory)."""
        return self.run_in_place(lambda: self.run_steps_watched(visit))

    def run_in_place(self, run: Callable[[], None]) -> list[Any]:
        """``run()`` the steps in this capture's memory (entered in its pool, under the pool's
        lock); the outputs, for the caller."""
        placed = self.program.placed
        if placed is None:
            run()
            return caller_aliases(self.program.outputs)
        with placed.pool.lock:
            placed.enter()
            run()
            placed.handing_out()
            # Aliases made under the lock: another key's replay sees them as held.
            return caller_aliases(self.program.outputs)

    @property
    def steps(self) -> list[Step]:
        """Every step a replay runs, in order: ``(fn, args, kwargs)``."""
        if self.program.kept_steps is not None:
            return self.program.kept_steps
        return steps_of(self.program.replay)

    def run_steps_watched(self, visit: Callable[[torch.fx.Node, Any], None]) -> None:
        points = sorted(self.program.watched, key=lambda point: point[0])
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
            self.program.replay()

    def release(self) -> None:
        if self.program.placed is not None:
            self.program.placed.leave()
        self.program = RELEASED

    @property
    def pool_bytes(self) -> int:
        return self.program.pool_bytes

    @property
    def kernel_count(self) -> int:
        return len(self.program.step_names)


def caller_aliases(outputs: list[Any]) -> list[Any]:
    """New tensor objects over the outputs' memory, for the caller.

    The engine re-points its own tensor objects when memory moves between captures; the caller's
    objects (and views of them) must never move with them.
    """
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs]
