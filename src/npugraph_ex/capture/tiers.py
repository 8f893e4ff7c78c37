"""A key that starts on its ATen replay and moves to compiled kernels once they are ready and
faster (``static_kernel_compile="background"``).

    aten      replays its ATen graph; at the ``background_compile_after``-th replay it asks for
              kernels (again at each replay while the workers are busy)
    pending   replays its ATen graph; at the first call after the kernels are ready they are
              captured (that call's result is theirs: nothing runs twice)
    trial     alternates the two forms on real calls, ``TRIAL_CALLS`` each, timed
    kernels   the kernels were at least ``background_min_gain`` times faster: the ATen graph is
              released
    aten kept the kernels were slower, failed to compile, failed to capture, or the key was not
              chosen (``static_kernel_sym_values``): they are released, or never made

Every switch happens at a call boundary, inside the call (under the pool's lock, as any replay).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import first_line
from npugraph_ex.kernels.background import BackgroundKernels
from npugraph_ex.runtime.base import Capture, CapturedGraph, Program

log = logging.getLogger(__name__)

TRIAL_CALLS = 5
"""Timed calls of each form before the faster is kept (their median)."""


class TieredGraph(CapturedGraph):
    """A captured key's graph that swaps in compiled kernels (see the module docstring)."""

    def __init__(
        self,
        aten: CapturedGraph,
        background: BackgroundKernels,
        capture: Callable[[Program], Capture],
        args: Sequence[Any],
        kept: Sequence[int],
        name: str,
        number: int,
    ):
        self.aten = aten
        self.current = aten
        self.background = background
        self.capture = capture
        self.args = args
        self.kept = kept
        self.name = name
        self.number = number
        """The graph's number, for messages said once per graph."""
        self.state = "aten" if background.wants(args) else "aten kept: not chosen"
        self.settled = self.state != "aten"
        self.replays = 0
        self.future: Future | None = None
        self.kernels: CapturedGraph | None = None
        self.times: dict[str, list[float]] = {"kernels": [], "aten": []}

    @property
    def outputs(self) -> list[Any]:  # type: ignore[override]
        return self.current.outputs

    def replay(self) -> list[Any]:
        if self.settled:
            return self.current.replay()
        if self.state == "aten":
            self.replays += 1
            if self.replays >= self.background.after:
                self.future = self.background.request(self.args, self.kept)
                if self.future is not None:
                    self.state = "pending"
            return self.aten.replay()
        if self.state == "pending":
            if not self.future.done():
                return self.aten.replay()
            return self.swap_in(self.future)
        return self.trial()

    def swap_in(self, future: Future) -> list[Any]:
        """This call runs the kernels as their capture, or the ATen graph if they fail."""
        self.future = None
        try:
            captured = self.capture(Program(future.result(), "kernels"))
        except Exception as error:  # a failed compile or capture: the ATen replay stays
            self.keep_aten("failed", f"{type(error).__name__}: {first_line(error)}")
            return self.aten.replay()
        self.kernels = captured.graph
        self.state = "trial"
        return captured.outputs

    def trial(self) -> list[Any]:
        kernels, aten = self.times["kernels"], self.times["aten"]
        form = "kernels" if len(kernels) <= len(aten) else "aten"
        graph = self.kernels if form == "kernels" else self.aten
        started = time.perf_counter()
        outputs = graph.replay()
        self.background.synchronize()
        self.times[form].append(time.perf_counter() - started)
        if len(aten) >= TRIAL_CALLS and len(kernels) >= TRIAL_CALLS:
            self.decide(statistics.median(kernels), statistics.median(aten))
        return outputs

    def decide(self, kernels: float, aten: float) -> None:
        if kernels * self.background.min_gain <= aten:
            self.aten.release()
            self.current = self.kernels
            self.state, self.settled = "kernels", True
            log.debug(
                "%s: compiled kernels kept (%.1f us against %.1f)",
                self.name,
                kernels * 1e6,
                aten * 1e6,
            )
            return
        self.keep_aten("slower", f"{kernels * 1e6:.1f} us a call against {aten * 1e6:.1f} us")

    def keep_aten(self, why: str, detail: str) -> None:
        if self.kernels is not None:
            self.kernels.release()
            self.kernels = None
        self.current = self.aten
        self.state, self.settled = f"aten kept: {why}", True
        level = logging.WARNING if why == "failed" else logging.INFO
        log_once(
            log,
            level,
            ("background", self.number, why),
            "npugraph_ex: %s: background kernels %s (%s); the key keeps its ATen replay",
            self.name,
            why,
            detail,
        )

    def release(self) -> None:
        if self.kernels is not None:
            self.kernels.release()
        self.aten.release()
        self.kernels = None
        self.settled, self.state = True, "released"

    @property
    def pool_bytes(self) -> int:
        return self.current.pool_bytes

    @property
    def kernel_count(self) -> int | None:
        return self.current.kernel_count
