"""A key that starts on its ATen replay and moves to compiled kernels once they are ready and
faster (``static_kernel_compile="background"``).

    aten      replays its ATen graph; once hot (``BackgroundKernels.hot``: its own replays, or
              its graph's for the compile its keys share) it asks for kernels (again at each
              replay while the workers are busy)
    pending   replays its ATen graph; at the first call after the kernels are ready they are
              captured (that call's result is theirs: nothing runs twice); shared kernels whose
              guards this key's inputs fail, or a shared compile that failed, send the key back
              to ``aten`` to ask for kernels of its own
    trial     alternates the two forms on real calls, ``TRIAL_CALLS`` each, timed (while no
              other compile runs: its calls replay ATen, untimed)
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
from npugraph_ex.kernels.cores import serving_threads
from npugraph_ex.kernels.symbolic import guards_hold
from npugraph_ex.kernels.workers import WORKERS, MadeKernels
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
        self.own = False
        """Asks for kernels made for its own sizes (the shared ones do not serve it)."""
        self.future: Future | None = None
        self.made: MadeKernels | None = None
        if not self.settled:
            self.future = background.stored_for(args)  # kept by an earlier process
            if self.future is not None:
                self.state = "pending"
        self.kernels: CapturedGraph | None = None
        self.times: dict[str, list[float]] = {"kernels": [], "aten": []}

    @property
    def outputs(self) -> list[Any]:  # type: ignore[override]
        return self.current.outputs

    def replay(self) -> list[Any]:
        if WORKERS.in_flight:  # leave the background cores to the compiles
            with serving_threads(self.background.cores):
                return self.step()
        return self.step()

    def step(self) -> list[Any]:
        if self.settled:
            return self.current.replay()
        if self.state == "aten":
            self.replays += 1
            self.background.replays += 1
            if self.background.hot(self.replays, self.own):
                self.future = self.background.request(self.args, self.kept, self.own)
                if self.future is not None:
                    self.state = "pending"
            return self.aten.replay()
        if self.state == "pending":
            if not self.future.done():
                return self.aten.replay()
            return self.swap_in(self.future)
        return self.trial()

    def swap_in(self, future: Future) -> list[Any]:
        """This call runs the kernels as their capture, or the ATen graph if they fail or do
        not serve this key."""
        self.future = None
        try:
            made: MadeKernels = future.result()
            if made.symbolic and not guards_hold(made.guards, self.args):
                return self.ask_own()
            captured = self.capture(Program(made.run, "kernels"))
        except Exception as error:  # a failed compile or capture: the ATen replay stays
            if self.background.forget(future):
                log.info("%s: stored kernels did not load (%s); compiled again", self.name, error)
                self.state = "aten"
                return self.aten.replay()
            if not self.own and self.background.failed(future):
                log.info(
                    "%s: the shared compile failed (%s: %s); keys compile one by one",
                    self.name,
                    type(error).__name__,
                    first_line(error),
                )
                return self.ask_own()
            self.keep_aten("failed", f"{type(error).__name__}: {first_line(error)}")
            return self.aten.replay()
        self.kernels, self.made = captured.graph, made
        self.state = "trial"
        if made.stored:  # kept by an earlier process: no trial
            self.use_kernels()
        return captured.outputs

    def ask_own(self) -> list[Any]:
        """Kernels made for this key's sizes: stored ones, or back to ``aten`` to ask for them
        once it is hot."""
        self.own = True
        self.future = self.background.stored_for(self.args, own=True)
        self.state = "aten" if self.future is None else "pending"
        return self.aten.replay()

    def trial(self) -> list[Any]:
        if WORKERS.in_flight:  # another compile shares the cores: no fair time; wait untimed
            return self.aten.replay()
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

    def use_kernels(self) -> None:
        self.aten.release()
        self.current = self.kernels
        self.state, self.settled = "kernels", True
        self.background.keep(self.made, self.args)

    def decide(self, kernels: float, aten: float) -> None:
        if kernels * self.background.min_gain <= aten:
            self.use_kernels()
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
