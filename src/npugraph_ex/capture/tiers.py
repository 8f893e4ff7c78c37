"""A key that starts on its ATen replay and moves to compiled kernels once they are ready, agree
with it and are faster (``static_kernel_compile="background"``; the graph's compiles are
``kernels/tier``).

    not hot   replays ATen; once hot (``KernelTier.hot``: its own replays, or its graph's for
              the compile its keys share) asks for kernels
    queued    hot, but ``background_compiles_in_flight`` compiles are in flight: asks again at
              each replay
    pending   replays ATen while its compile runs; at the first call after the reply came, the
              serving thread loads it (``KernelTier.load``); at the first call after the load's
              first run, the swap: both forms run on this call's inputs, and the kernels serve
              only where they agree (``agreement``): shared kernels whose guards this key's
              inputs fail, or a failed shared compile, send the key back to ``not hot`` to ask
              for kernels of its own; stored kernels that fail to load, to ask for new ones
    trial     alternates the two forms on real calls, ``TRIAL_CALLS`` each, timed (while no
              other compile runs: its calls replay ATen, untimed)
    kernels   the kernels were at least ``background_min_gain`` times faster (or were kept by an
              earlier process): the ATen graph is released
    kept ATen the kernels were slower, disagreed, failed, or the key was not chosen
              (``static_kernel_sym_values``): they are released, or never made; kernels that
              were slower are tried again ``RETRIAL_SECONDS`` later (back to ``pending``, their
              compile kept and ready: swapped in, checked and timed once more)

``TRANSITIONS`` is the whole table; every switch happens at a call boundary, inside the call
(under the pool's lock, as any replay). ``reason`` says why a key is not on kernels.
"""

from __future__ import annotations

import enum
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from npugraph_ex.capture.agreement import disagreement, values_of
from npugraph_ex.capture.inputs import restore, snapshot
from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import error_summary
from npugraph_ex.kernels.cores import serving_threads
from npugraph_ex.kernels.processes import PROCESSES
from npugraph_ex.kernels.remote_compile import NOTHING_TO_COMPILE
from npugraph_ex.kernels.symbolic import guards_hold
from npugraph_ex.kernels.tier import Compile, CompileState, KernelTier
from npugraph_ex.runtime.base import Capture, CapturedGraph, Program

log = logging.getLogger(__name__)

TRIAL_CALLS = 5
"""Timed calls of each form before the faster is kept (their median)."""

RETRIAL_SECONDS = (30.0, 300.0, 3000.0)
"""After kernels lose a trial, how long the key waits before each further one; after the last,
it keeps its ATen replay. A trial times real calls on cores the process may share with others,
and their load can make compiled kernels look far slower than they are for a while: with a
second process of compiles and tests on a 2-core host, Inductor's kernels timed 23.7 ms a
call against the ATen replay's 97.6 us (its parallel regions wait for a thread the other
process holds; the ATen replay's small ops run on one). A server's workers start, load and
compile at once. A key whose kernels are truly slower pays a swap and five calls each time."""


class KeyState(enum.Enum):
    """A tiered key's state; the value is what ``stats()`` counts it under."""

    NOT_HOT = "aten"
    QUEUED = "queued"
    PENDING = "pending"
    TRIAL = "trial"
    KERNELS = "kernels"
    NOT_CHOSEN = "aten kept: not chosen"
    SLOWER = "aten kept: slower"
    DISAGREE = "aten kept: disagree"
    FAILED = "aten kept: failed"
    RELEASED = "released"


S = KeyState
TRANSITIONS: dict[KeyState, frozenset[KeyState]] = {
    S.NOT_HOT: frozenset({S.QUEUED, S.PENDING, S.NOT_CHOSEN, S.RELEASED}),
    S.QUEUED: frozenset({S.PENDING, S.RELEASED}),
    S.PENDING: frozenset(
        {S.NOT_HOT, S.PENDING, S.TRIAL, S.KERNELS, S.NOT_CHOSEN, S.DISAGREE, S.FAILED, S.RELEASED}
    ),
    S.TRIAL: frozenset({S.KERNELS, S.SLOWER, S.RELEASED}),
    S.SLOWER: frozenset({S.PENDING, S.RELEASED}),  # tried again (``RETRIAL_SECONDS``)
    **dict.fromkeys((S.KERNELS, S.NOT_CHOSEN, S.DISAGREE, S.FAILED), frozenset({S.RELEASED})),
    S.RELEASED: frozenset(),
}
"""Each state and the states a key may move to from it."""
SETTLED = frozenset(s for s, moves in TRANSITIONS.items() if moves <= {S.RELEASED}) | {S.SLOWER}
"""States a key keeps until it is released, or, kept slower, until its next trial is due."""


class TieredGraph(CapturedGraph):
    """A captured key's graph that swaps in compiled kernels (see the module docstring)."""

    def __init__(
        self,
        aten: CapturedGraph,
        tier: KernelTier,
        capture: Callable[[Program], Capture],
        args: Sequence[Any],
        kept: Sequence[int],
        written: Sequence[int],
        name: str,
        number: int,
    ):
        self.aten = aten
        self.current = aten
        self.tier = tier
        self.capture = capture
        self.args = args
        self.kept = kept
        self.written = written
        """The inputs the graph writes, which the swap's two runs must both start from."""
        self.name = name
        self.number = number
        """The graph's number, for messages said once per graph."""
        self.state = KeyState.NOT_HOT
        self.detail = ""
        """Why the key settled where it did (kept ATen), for ``reason``."""
        self.replays = 0
        self.own = False
        """Asks for kernels made for its own sizes (the shared ones do not serve it)."""
        self.compile: Compile | None = None
        self.kernels: CapturedGraph | None = None
        self.times: dict[str, list[float]] = {"kernels": [], "aten": []}
        self.lost_trials = 0
        """Trials its kernels lost so far."""
        self.retrial_at: float | None = None
        """When kernels kept slower are tried again (``time.monotonic``); None: never."""
        if tier.empty:
            self.move(KeyState.NOT_CHOSEN, NOTHING_TO_COMPILE)
        elif not tier.wants(args):
            self.move(KeyState.NOT_CHOSEN, "static_kernel_sym_values leaves it out")
        else:
            self.take_stored()

    @property
    def settled(self) -> bool:
        return self.state in SETTLED

    def move(self, state: KeyState, detail: str = "") -> None:
        if state not in TRANSITIONS[self.state] and state is not self.state:
            raise AssertionError(f"{self.name}: no move from {self.state} to {state}")
        self.state, self.detail = state, detail

    @property
    def reason(self) -> str:
        """Where the key stands, and why it is not on kernels where it is not."""
        if self.state is KeyState.NOT_HOT:
            shared = self.tier.shares(self.own)
            if shared and self.tier.hot(self.replays, self.own):  # captured since it was hot
                return "not hot: asks for the graph's shared kernels at its next replay (ATen)"
            replays = self.tier.replays if shared else self.replays
            whose = "the graph's keys' " if shared else ""
            return f"not hot: {replays} of {self.tier.after} replays ({whose}ATen)"
        if self.state is KeyState.QUEUED:
            return f"queued behind {PROCESSES.in_flight} compile(s) in flight"
        if self.state is KeyState.PENDING:
            return pending_reason(self.compile)
        if self.state is KeyState.TRIAL:
            done = min(len(t) for t in self.times.values())
            return f"on trial: {done} of {TRIAL_CALLS} timed calls of each form"
        if self.state is KeyState.KERNELS:
            return "on kernels"
        if self.retrial_at is not None:
            due = max(0.0, self.retrial_at - time.monotonic())
            return f"{self.state.value}: {self.detail}; tried again in {due:.0f} s"
        return f"{self.state.value}: {self.detail}" if self.detail else self.state.value

    @property
    def outputs(self) -> list[Any]:  # type: ignore[override]
        return self.current.outputs

    def replay(self) -> list[Any]:
        if self.state in (KeyState.NOT_HOT, KeyState.QUEUED):
            # First: a compile this starts takes its cores from this call's replay already
            # (replayed on every core beside a starting compile process, one call took 150 ms).
            self.count_and_ask()
        if PROCESSES.in_flight:  # leave the background cores to the compiles
            with serving_threads(self.tier.cores):
                return self.step()
        return self.step()

    def replay_on(self, args: Sequence[Any]) -> list[Any] | None:
        """Settled on kernels, with no compile in flight: the kernels on the caller's inputs."""
        if self.state is not KeyState.KERNELS or PROCESSES.in_flight:
            return None
        return self.current.replay_on(args)

    def step(self) -> list[Any]:
        if self.retrial_at is not None and time.monotonic() >= self.retrial_at:
            self.retry()
        if self.state is KeyState.PENDING:
            return self.pending()
        if self.state is KeyState.TRIAL:
            return self.trial()
        return self.current.replay()  # settled, or not hot or queued (ATen)

    def count_and_ask(self) -> None:
        self.replays += 1
        self.tier.replays += 1
        if self.tier.hot(self.replays, self.own):
            self.compile = self.tier.request(self.args, self.kept, self.own)
            self.move(KeyState.QUEUED if self.compile is None else KeyState.PENDING)

    def pending(self) -> list[Any]:
        made = self.compile
        if made.state is CompileState.READY:
            return self.swap_in(made)
        outputs = self.aten.replay()
        if made.state is CompileState.RECEIVED:
            self.tier.load(made)  # after this call's replay: its caller waits either way
        if made.state is CompileState.FAILED:
            self.after_failure(made)
        return outputs

    def after_failure(self, made: Compile) -> None:
        """A compile this key waited for failed (or did not load)."""
        if NOTHING_TO_COMPILE in made.error:  # Inductor's own passes left no op: not a failure
            self.keep_aten(KeyState.NOT_CHOSEN, NOTHING_TO_COMPILE)
        elif made.stored:
            log.info("%s: stored kernels did not serve (%s); compiled again", self.name, made.error)
            self.tier.forget(made)
            self.move(KeyState.NOT_HOT)
        elif made.symbolic:
            log_once(
                log,
                logging.INFO,
                ("shared compile failed", self.number),
                "%s: the shared compile failed (%s); keys compile one by one",
                self.name,
                made.error,
            )
            self.tier.drop_symbolic()
            self.ask_own()
        else:
            self.keep_aten(KeyState.FAILED, made.error)

    def ask_own(self) -> None:
        """Kernels made for this key's sizes: stored ones, or back to ``not hot`` to ask for
        them once it is hot by itself."""
        self.own = True
        if not self.take_stored():
            self.move(KeyState.NOT_HOT)

    def take_stored(self) -> bool:
        """Wait for kernels an earlier process kept for this key, if there are any."""
        stored = self.tier.compile_for(self.args, self.own)
        if stored is None or not stored.stored:
            return False
        self.compile = stored
        self.move(KeyState.PENDING)
        return True

    def swap_in(self, made: Compile) -> list[Any]:
        """This call runs the kernels, as their capture, then the ATen graph, on the same
        inputs (the written ones put back between the two): the kernels serve from the next
        call on where the two agree, else the key keeps ATen. The kernels run first: the ATen
        graph may reuse its input buffers' bytes once it has read them. The call returns the
        ATen graph's results: the kernels' are copies, made to compare, which no longer share
        memory where eager's outputs do (``y`` and ``y.t()``)."""
        if made.symbolic and not guards_hold(made.guards, self.args):
            self.ask_own()
            return self.aten.replay()
        saved = snapshot(self.args, self.written, self.tier.draws_random)
        try:
            captured = self.capture(Program(made.run, "kernels"))
        except Exception as error:  # the ATen replay stays; the call gets its results
            failure = error_summary(error)
            if made.symbolic:
                self.ask_own()
            elif made.stored:  # an earlier process's kernels: this one compiles its own
                made.error = failure
                self.after_failure(made)
            else:
                self.keep_aten(KeyState.FAILED, failure)
            return self.aten.replay()
        got = values_of(captured.outputs, [self.args[i] for i in self.written])
        restore(saved)
        outputs = self.aten.replay()
        wrong = disagreement(got, [*outputs, *(self.args[i] for i in self.written)])
        if wrong is not None:
            captured.graph.release()
            self.keep_aten(KeyState.DISAGREE, f"kernels disagree with the ATen replay: {wrong}")
            return outputs
        self.kernels = captured.graph
        self.move(KeyState.TRIAL)
        if made.stored:  # kept by an earlier process: no trial
            self.use_kernels()
        return outputs

    def trial(self) -> list[Any]:
        if PROCESSES.in_flight:  # another compile shares the cores: no fair time; wait untimed
            return self.aten.replay()
        kernels, aten = self.times["kernels"], self.times["aten"]
        form = "kernels" if len(kernels) <= len(aten) else "aten"
        graph = self.kernels if form == "kernels" else self.aten
        started = time.perf_counter()
        outputs = graph.replay()
        self.tier.synchronize()
        self.times[form].append(time.perf_counter() - started)
        if len(aten) >= TRIAL_CALLS and len(kernels) >= TRIAL_CALLS:
            self.decide(statistics.median(kernels), statistics.median(aten))
        return outputs

    def retry(self) -> None:
        """Kernels that lost a trial, tried again (``RETRIAL_SECONDS``): their compile is
        ready, so this call swaps them in, checked, and the calls after it time them afresh."""
        self.retrial_at = None
        self.times = {"kernels": [], "aten": []}
        self.move(KeyState.PENDING)
        log.debug("%s: kernels slower in trial %d; tried again", self.name, self.lost_trials)

    def use_kernels(self) -> None:
        self.aten.release()
        self.current = self.kernels
        self.move(KeyState.KERNELS)
        self.tier.keep(self.compile, self.args)

    def decide(self, kernels: float, aten: float) -> None:
        if kernels * self.tier.min_gain <= aten:
            self.use_kernels()
            log.debug(
                "%s: compiled kernels kept (%.1f us against %.1f)",
                self.name,
                kernels * 1e6,
                aten * 1e6,
            )
            return
        detail = f"{kernels * 1e6:.1f} us a call against {aten * 1e6:.1f} us"
        if self.lost_trials < len(RETRIAL_SECONDS):
            self.retrial_at = time.monotonic() + RETRIAL_SECONDS[self.lost_trials]
        self.lost_trials += 1
        self.keep_aten(KeyState.SLOWER, detail)

    def keep_aten(self, state: KeyState, detail: str) -> None:
        if self.kernels is not None:
            self.kernels.release()
            self.kernels = None
        self.current = self.aten
        self.move(state, detail)
        why = state.value.removeprefix("aten kept: ")
        later = "" if self.retrial_at is None else " and tries the kernels again later"
        log_once(
            log,
            logging.WARNING if state in (KeyState.FAILED, KeyState.DISAGREE) else logging.INFO,
            ("background", self.number, why),
            "npugraph_ex: %s: background kernels %s (%s); the key keeps its ATen replay%s",
            self.name,
            why,
            detail,
            later,
        )

    def release(self) -> None:
        if self.kernels is not None:
            self.kernels.release()
        self.aten.release()
        self.kernels = None
        self.retrial_at = None
        self.move(KeyState.RELEASED)

    @property
    def pool_bytes(self) -> int:
        return self.current.pool_bytes

    @property
    def kernel_count(self) -> int | None:
        return self.current.kernel_count


def pending_reason(made: Compile) -> str:
    if made.state is CompileState.COMPILING:
        return f"compiling for {time.monotonic() - made.started:.1f} s"
    if made.state is CompileState.RECEIVED:
        return "compiled; loaded at the next call" if not made.stored else "stored; loading"
    if made.state is CompileState.WARMING:
        return "loaded; first run on copies of the inputs"
    return "ready; swapped in at the next call"
