"""The capture manager: one per optimised FX graph; decides, per call, replay, capture or eager.

Per call: compute the graph key (``inputs.InputLayout``); a known key whose mutated inputs sit
where they sat at capture replays; a mutated input at a new address recaptures that key (after
``MOVED_INPUTS_NOTICE`` such calls in a row the graph copies its written inputs in and out
instead, ``copy_written_inputs``); a new key is captured (its ``Program``, from ``programs``)
while fewer than ``capture_limit`` keys exist, and past the limit runs the graph eagerly while the
captured keys keep replaying. A graph that cannot be captured always runs eagerly, and says why
once. Every call has the effect of exactly one execution of the graph: warm-up runs before a
capture are undone on the inputs it writes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from npugraph_ex.capture import inputs as io
from npugraph_ex.capture import notices
from npugraph_ex.capture.analysis import GraphFacts
from npugraph_ex.capture.pools import PoolPolicy
from npugraph_ex.capture.programs import KeyPrograms
from npugraph_ex.capture.stats import GraphStats, key_info, live_view, register
from npugraph_ex.config import Config
from npugraph_ex.debug.compile_debug import compile_log, debug_folder, write_capture_summary
from npugraph_ex.debug.profiling import profiled
from npugraph_ex.errors import error_summary
from npugraph_ex.runtime.base import Capture, CapturedGraph, DeviceRuntime, Program, as_output_list
from npugraph_ex.runtime.output_copies import copied_outputs

log = logging.getLogger(__name__)

GLOBAL_CAPTURE_LOCK = threading.RLock()
"""Held during every capture made with ``capture_error_mode="global"``."""
MOVED = "mutated input moved"
"""The recapture of a key whose written input arrived at a new address."""


@dataclass
class CapturedKey:
    label: str
    graph: CapturedGraph
    staged: io.StagedInputs
    pool: Any
    replays: int = 0
    released: bool = False
    """Dropped while another thread had it in hand: that call runs eagerly (``replay``)."""


class CaptureManager:
    """Maps each call of one optimised graph to a replay, a capture, or an eager run."""

    def __init__(
        self,
        fn: Callable[..., Any],
        facts: GraphFacts,
        config: Config,
        runtime: DeviceRuntime,
        *,
        name: str,
        programs: KeyPrograms,
    ):
        self.fn = fn
        self.programs = programs
        self.facts = facts
        self.config = config
        self.runtime = runtime
        self.layout = io.InputLayout(facts, frozen=config.frozen_parameter)
        self.pools = PoolPolicy(config, runtime)
        self.entries: dict[tuple, CapturedKey] = {}
        self.capturing = threading.Lock()
        """Held while a call checks ``capture_limit`` and captures a new key."""
        self.captures_made = 0
        self.moves_in_a_row = 0
        """Captures in a row, each because a tensor the graph writes arrived at a new address,
        with no replay of any key between them (``count_moves``)."""
        self.replays_at_last_move = -1
        self.blocker = None if config.force_eager else facts.blocker
        self.stats = GraphStats(name, facts.device_type, live_view(self))
        self.number = register(self)
        programs.number = self.number  # one number names the graph everywhere
        if self.blocker is not None:
            self.refuse(self.blocker)

    def __call__(self, args: list[Any]) -> list[Any]:
        if self.config.force_eager:
            # What a capture of these sizes would replay (``key_shapes``), run eagerly.
            return self.run_eager(args, "force_eager", self.programs.graph_for(args))
        if self.blocker is not None:
            if self.config.strict_capture:
                raise notices.strict_error(self.stats.name, self.blocker)
            return self.run_eager(args, "cannot capture")
        key = self.layout.key_of(args)
        entry = self.entries.get(key)
        if entry is None:
            # One thread at a time checks the limit and captures: two calls of new keys would
            # otherwise both pass the check (7 keys under capture_limit=6, seen in a soak).
            with self.capturing:
                entry = self.entries.get(key)  # another thread's call may have captured it
                if entry is None:
                    self.drop_keys_of_replaced_parameters(args)
                    captured = len(self.entries)
                    if captured < self.config.capture_limit:
                        return self.capture(key, args, recapture_reason=None)
            if entry is None:  # eagerly, outside the lock
                limit = self.config.capture_limit
                notices.say_limit(self.stats.name, self.number, limit, captured)
                return self.run_eager(args, "capture_limit")
        if self.config.force_recapture:
            return self.capture(key, args, recapture_reason="force_recapture")
        if self.layout.mutated_addresses(args) != entry.staged.mutated_addresses:
            return self.capture(key, args, recapture_reason=MOVED)
        return self.replay(entry, args)

    def replay(
        self, entry: CapturedKey, args: Sequence[Any], visit: Callable[..., None] | None = None
    ) -> list[Any]:
        """Replay ``entry`` on ``args``; with ``visit``, step by step, calling it with each
        node's value as soon as it is complete."""
        if self.config.frozen_parameter and log.isEnabledFor(logging.DEBUG):
            # The debug check of frozen_parameter's promise (logger npugraph_ex at DEBUG).
            self.layout.check_frozen(args, entry.staged, self.stats.name, entry.label)
        with self.runtime.pool_lock(entry.pool), profiled("replay", self.stats.name, entry.label):
            if entry.released:  # another thread's call dropped the key since this one found it
                return self.run_eager(args, "key dropped by another call")
            try:
                reads_args = visit is None and entry.staged.buffers_as_called
                raw = entry.graph.replay_on(args) if reads_args else None
                if raw is None:
                    io.refresh(entry.staged.copies, args)
                    raw = (
                        entry.graph.replay() if visit is None else entry.graph.replay_watched(visit)
                    )
                    if entry.staged.written_back:  # a call and a loop saved on every other replay
                        io.write_back(entry.staged.written_back, args)
            except Exception:
                self.stats.failed("replay")
                raise
            outputs = self.for_caller(raw, entry.staged.args)
        self.stats.replayed()
        entry.replays += 1
        return outputs

    def for_caller(self, outputs: list[Any], static_args: Sequence[Any]) -> list[Any]:
        """What the caller gets: the graph's own outputs, or with ``clone_output`` copies of
        them (made under the pool's lock, before another call can rewrite them)."""
        if not self.config.clone_output:
            return outputs
        return copied_outputs(outputs, static_args)

    def pool_bytes(self) -> dict[int, int]:
        """Bytes held by each pool (by identity) that a live key of this graph draws from."""
        pools = {id(e.pool): e.pool for e in self.entries.values()}
        return {key: self.runtime.pool_bytes(pool) for key, pool in pools.items()}

    def run_eager(
        self, args: Sequence[Any], reason: str, fn: Callable[..., Any] | None = None
    ) -> list[Any]:
        """Run ``fn`` (by default the graph as compiled) on ``args``, counted under ``reason``
        (and under ``failed_calls`` too when it raises)."""
        self.stats.ran_eagerly(reason)
        try:
            return as_output_list((fn or self.fn)(*args))
        except Exception:
            self.stats.failed(reason)
            raise

    def capture(self, key: tuple, args: list[Any], *, recapture_reason: str | None) -> list[Any]:
        old = self.entries.pop(key, None)
        if old is not None:
            self.release_entry(old)
        # A pool's first key holds it with an empty capture, and its buffers may be new device
        # memory: under a capture in 'global' mode on another thread either would fail it.
        with self.global_capture_lock():
            pool = self.pools.for_new_key()
            buffers = None
            if self.config.clone_input:
                buffers = functools.partial(self.runtime.input_buffers, pool=pool)
            staged = self.layout.stage(args, buffers)
        key = self.layout.stored_key(key)
        # Kernels compile outside the locks: a compile may take minutes, and reads no input data.
        program = self.programs.for_key(staged.args)
        started = time.perf_counter()
        label = f"key{self.captures_made}: {self.layout.describe(key)}"
        folder = debug_folder(self.config, self.stats.name)
        with (
            self.runtime.pool_lock(pool),
            profiled("capture", self.stats.name, label),
            compile_log(folder),
        ):
            try:
                captured = self.capture_staged(staged, pool, program)
            except Exception as error:  # any failure to capture falls back to eager
                return self.after_failed_capture(args, error)
            self.stats.capture_seconds += time.perf_counter() - started
            self.captures_made += 1
            capture_again = functools.partial(self.capture_staged, staged, pool)
            kept = self.layout.static
            written = self.layout.mutated
            graph = self.programs.tiered(captured.graph, capture_again, staged.args, kept, written)
            entry = self.entries[key] = CapturedKey(label, graph, staged, pool)
            self.stats.captured(recapture_reason)
            seconds = time.perf_counter() - started
            copy_from_now_on = recapture_reason == MOVED and self.count_moves(entry, seconds)
            log.debug("%s: captured %s (%s)", self.stats.name, label, key_info(entry))
            if recapture_reason is None:
                notices.say_value_keys(self.stats.name, self.number, self.layout, key, self.entries)
            if folder is not None:
                write_capture_summary(folder, label, captured.graph)
            io.write_back(staged.written_back, args)
            outputs = self.for_caller(captured.outputs, staged.args)
        if copy_from_now_on:  # outside the pool's lock: it takes the lock of every key's pool
            self.copy_written_inputs()
        return outputs

    def count_moves(self, entry: CapturedKey, seconds: float) -> bool:
        """``entry`` was captured because a written input moved: when the graph has replayed
        nothing since the last ``MOVED_INPUTS_NOTICE`` such captures, say so once; True where
        written inputs are to be copied from then on, as the key's own buffers can be had
        (``clone_input``): each capture copied them twice anyway (``capture_staged`` keeps
        them to undo the warm-up), and ran the graph twice more. A caller that writes a new
        tensor per call gets there; ``generate()``'s one-token step, whose new cache moves each
        key once and is then replayed for every token, does not."""
        replays = self.stats.replays
        self.moves_in_a_row = self.moves_in_a_row + 1 if replays == self.replays_at_last_move else 1
        self.replays_at_last_move = replays
        if self.moves_in_a_row == notices.MOVED_INPUTS_NOTICE:
            shapes = [tuple(entry.staged.args[i].shape) for i in self.layout.mutated]
            copied = self.config.clone_input
            notices.say_moved_inputs(
                self.stats.name, self.number, self.moves_in_a_row, shapes, seconds, copied=copied
            )
            return copied
        return False

    def copy_written_inputs(self) -> None:
        """From now on give written inputs buffers of each key's own, copied in before each
        replay and back after it, in place of a capture per call; the keys captured on the
        callers' own tensors go."""
        self.layout = io.InputLayout(
            self.facts, frozen=self.config.frozen_parameter, written_copied=True
        )
        self.drop_keys(list(self.entries), "written inputs copied from now on")

    def after_failed_capture(self, args: list[Any], error: Exception) -> list[Any]:
        """Run the call eagerly. If eager fails too, the call itself is bad (an index out of
        range): its error reaches the caller and capture stays on for the next call. Else the
        graph cannot be captured, and every later call runs eagerly (or raises when strict)."""
        try:
            outputs = self.run_eager(args, "capture failed")
        except Exception:
            log.debug("%s: a call failed eagerly too; capture stays on", self.stats.name)
            raise
        self.refuse(f"capture failed: {error_summary(error)}")
        if self.config.strict_capture:
            raise notices.strict_error(self.stats.name, self.blocker) from error
        return outputs

    def capture_staged(self, staged: io.StagedInputs, pool: Any, program: Program) -> Capture:
        """Warm up, undo the warm-up's writes, then capture ``program``; a capture that fails
        while it runs the program has its writes undone too."""
        saved = io.snapshot(staged.args, self.layout.mutated, self.facts.draws_random)
        try:
            with self.global_capture_lock():
                if self.config.num_warmup_iters and self.runtime.warms_up(program.kind):
                    self.runtime.warmup(program.fn, staged.args, self.config.num_warmup_iters)
                    io.restore(saved)
                # A written input's buffer holds its result until it is copied back: its memory
                # is no intermediate's after its last write.
                owned = (
                    tuple(i for i, _ in staged.copies if i not in self.layout.mutated)
                    if self.config.clone_input
                    else ()
                )
                return self.runtime.capture(program, staged.args, pool, owned)
        except Exception:
            io.restore(saved)
            raise

    def global_capture_lock(self) -> contextlib.AbstractContextManager[Any]:
        """``GLOBAL_CAPTURE_LOCK`` where captures are in ``capture_error_mode='global'``."""
        if self.config.capture_error_mode == "global":
            return GLOBAL_CAPTURE_LOCK
        return contextlib.nullcontext()

    def drop_keys_of_replaced_parameters(self, args: Sequence[Any]) -> None:
        """Release keys captured against parameters the model has since replaced and freed
        (``lin.weight = Parameter(new)``) or given new memory (``lin.weight.data = new``, as a
        weight reload does): they can never match again, and would keep the old weights alive.
        Checked when a call misses every key, as such a swap makes it do; keys staged with this
        call's parameters (most of them) are skipped at once."""
        if not self.layout.static:
            return
        current = self.layout.parameter_addresses(args)
        stale = [
            key
            for key, entry in list(self.entries.items())  # another thread may add or drop one
            if entry.staged.parameter_addresses != current and not entry.staged.parameters_current()
        ]
        self.drop_keys(stale, "parameters replaced")

    def drop_keys(self, keys: Sequence[tuple], reason: str) -> None:
        """Take ``keys`` out of ``entries`` and release them, each counted under ``reason``."""
        for key in keys:
            entry = self.entries.pop(key, None)
            if entry is not None:  # else another thread's call dropped it first
                self.release_entry(entry)
                self.stats.dropped(reason)

    def refuse(self, reason: str) -> None:
        """Stop capturing this graph: every later call runs eagerly (or raises when strict)."""
        self.blocker = reason
        if not self.config.strict_capture:
            notices.say_refused(self.stats.name, self.number, reason)

    def restart_counts(self) -> None:
        """Counters from zero (``reset_stats``); the captured keys stay."""
        self.stats = self.stats.restarted()
        self.programs.reset_counts()
        for entry in self.entries.values():
            entry.replays = 0

    def release_entry(self, entry: CapturedKey) -> None:
        """Release a key taken out of ``entries``, under its pool's lock: a call of another
        thread replaying it finishes first, and one that found it before it went runs eagerly."""
        with self.runtime.pool_lock(entry.pool):
            entry.released = True
            entry.graph.release()

    def release(self) -> None:
        for entry in list(self.entries.values()):
            self.release_entry(entry)
        self.entries.clear()
