"""The capture manager: one per optimised FX graph; decides, per call, replay, capture or eager.

Per call: compute the graph key (``inputs.InputLayout``); a known key whose mutated inputs sit
where they sat at capture replays; a mutated input at a new address recaptures that key; a new key
is captured while fewer than ``capture_limit`` keys exist, and past the limit runs the graph
eagerly while the captured keys keep replaying. A graph that cannot be captured always runs
eagerly, and says why once.

Every call has the effect of exactly one execution of the graph: warm-up runs before a capture
are undone on the inputs the graph writes (they are snapshotted first and restored after).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx

from npugraph_ex.capture import inputs as io
from npugraph_ex.capture.analysis import GraphFacts
from npugraph_ex.capture.key_shapes import KeySpecialiser
from npugraph_ex.capture.stats import GraphStats, register
from npugraph_ex.config import Config
from npugraph_ex.debug.compile_debug import compile_log, debug_folder, write_capture_summary
from npugraph_ex.debug.dump import CallDump, TensorDumper, say_dumps_run_eagerly
from npugraph_ex.debug.once import log_once
from npugraph_ex.debug.profiling import profiled
from npugraph_ex.errors import CaptureError, ConfigError, UnsupportedGraphError, first_line
from npugraph_ex.runtime.base import CapturedGraph, DeviceRuntime, as_output_list
from npugraph_ex.runtime.output_copies import copied_outputs
from npugraph_ex.runtime.watched import WatchedRun

log = logging.getLogger(__name__)

VALUE_KEYS_NOTICE = 4
"""Keys that differ only in the values of the graph's int (or host scalar) inputs, after which
the graph says that every new value is a new capture."""

GLOBAL_CAPTURE_LOCK = threading.RLock()
"""Held during every capture made with ``capture_error_mode="global"``."""


@dataclass
class CapturedKey:
    label: str
    graph: CapturedGraph
    staged: io.StagedInputs
    pool: Any


def pools_of(manager: CaptureManager) -> Callable[[], dict[int, int]]:
    """``manager.pool_bytes`` without keeping the manager alive from its own stats."""
    ref = weakref.ref(manager)

    def pools() -> dict[int, int]:
        live = ref()
        return live.pool_bytes() if live is not None else {}

    return pools


KEPT_POOLS: dict[tuple[str, Any], Any] = {}
"""Holds of the handles given through ``use_graph_pool``, for the process's life: a handle may
outlive every graph compiled with it and then be given to the next."""


class PoolPolicy:
    """Which memory pool each new key's capture draws from (DESIGN: one pool per FX graph).

    ``use_graph_pool`` given: that handle, for every key of every graph compiled with it. Else
    ``reuse_graph_pool_in_same_fx``: one pool for all keys of this graph. Else a pool per key.
    A shared pool is held (``DeviceRuntime.hold_pool``) from its first capture on, so that
    releasing its keys (a recapture, freed parameters, a model deleted) never leaves a later
    capture a pool the device's allocator forgot.
    """

    def __init__(self, config: Config, runtime: DeviceRuntime):
        handle = config.use_graph_pool
        if handle is not None and not runtime.accepts_pool(handle):
            raise ConfigError(
                f"use_graph_pool must be a pool handle for {runtime.name} graphs, got "
                f"{handle!r}; make one with npugraph_ex.graph_pool_handle({runtime.name!r})",
                option="use_graph_pool",
            )
        self.runtime = runtime
        self.shared = handle
        self.given = handle is not None
        self.per_key = handle is None and not config.reuse_graph_pool_in_same_fx
        self.hold: Any = None
        self.held = False

    def for_new_key(self) -> Any:
        if self.per_key:
            return self.runtime.new_pool()
        if self.shared is None:
            self.shared = self.runtime.new_pool()
        if not self.held:
            self.hold_shared()
        return self.shared

    def hold_shared(self) -> None:
        self.held = True
        if not self.given:
            self.hold = self.runtime.hold_pool(self.shared)
            return
        key = (self.runtime.name, self.shared)
        if key not in KEPT_POOLS and (hold := self.runtime.hold_pool(self.shared)) is not None:
            KEPT_POOLS[key] = hold


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
        kernels: Any = None,
        specialiser: KeySpecialiser | None = None,
        dumper: TensorDumper | None = None,
    ):
        self.fn = fn
        self.kernels = kernels
        """With ``static_kernel_compile``: ``compile(args) -> (fn, outcome)`` per new key."""
        self.specialiser = specialiser
        """For a CPU graph with symbolic row counts: what a key with few rows runs instead of
        ``fn`` (its products split, ``key_shapes``)."""
        self.dumper = dumper
        """With ``dump_tensor_data`` on the optimised graph: which calls to dump, and where."""
        self.facts = facts
        self.config = config
        self.runtime = runtime
        self.layout = io.InputLayout(facts, frozen=config.frozen_parameter)
        self.pools = PoolPolicy(config, runtime)
        self.entries: dict[tuple, CapturedKey] = {}
        self.captures_made = 0
        self.blocker = None if config.force_eager else facts.blocker
        self.stats = GraphStats(name=name, device=facts.device_type, pools=pools_of(self))
        self.number = register(self)
        if self.blocker is not None:
            self.refuse(self.blocker)

    def __call__(self, args: list[Any]) -> list[Any]:
        dump = self.dumper.next_call() if self.dumper is not None else None
        if dump is None:
            return self.run(args)
        try:
            return self.run_dumped(args, dump)
        finally:
            dump.finish()

    def run(self, args: list[Any]) -> list[Any]:
        if self.config.force_eager:
            # What a capture of these sizes would replay (``key_shapes``), run eagerly.
            return self.run_eager(args, "force_eager", self.graph_for(args))
        if self.blocker is not None:
            if self.config.strict_capture:
                raise self.strict_error()
            return self.run_eager(args, "cannot capture")
        key = self.layout.key_of(args)
        entry = self.entries.get(key)
        if entry is None:
            self.drop_keys_of_replaced_parameters(args)
            if len(self.entries) >= self.config.capture_limit:
                self.warn_limit()
                return self.run_eager(args, "capture_limit")
            return self.capture(key, args, recapture_reason=None)
        if self.config.force_recapture:
            return self.capture(key, args, recapture_reason="force_recapture")
        if self.layout.mutated_addresses(args) != entry.staged.mutated_addresses:
            return self.capture(key, args, recapture_reason="mutated input moved")
        return self.replay(entry, args)

    def replay(
        self, entry: CapturedKey, args: Sequence[Any], visit: Callable[..., None] | None = None
    ) -> list[Any]:
        """Replay ``entry`` on ``args``; with ``visit``, step by step, calling it with each
        node's value as soon as it is complete."""
        if self.config.frozen_parameter and log.isEnabledFor(logging.DEBUG):
            self.check_frozen_parameters(entry, args)
        with self.runtime.pool_lock(entry.pool), profiled("replay", self.stats.name, entry.label):
            try:
                io.refresh(entry.staged.copies, args)
                raw = entry.graph.replay() if visit is None else entry.graph.replay_watched(visit)
            except Exception:
                self.stats.failed("replay")
                raise
            outputs = self.for_caller(raw, entry.staged.args)
        self.stats.replayed(entry.label)
        return outputs

    def run_dumped(self, args: list[Any], dump: CallDump) -> list[Any]:
        """A call whose nodes' outputs are dumped: its key's replay, read after each node's
        kernels (a new key is captured first, its effects undone), where the runtime can;
        else the graph run node by node."""
        reason = self.why_replays_cannot_be_dumped()
        if reason is None:
            entry = self.replayable(args)
            if entry is None:
                saved = io.snapshot(args, self.layout.mutated)
                self.run(args)  # captures the key as any first call would
                io.restore(saved)
                entry = self.replayable(args)
            if entry is not None:
                dump.begin(entry.label.split(":")[0], "replay", self.fn.graph)
                return self.replay(entry, args, visit=dump.visit)
            reason = "this call's key is not captured"
        say_dumps_run_eagerly(self.stats.name, reason, self.number)
        self.stats.ran_eagerly("dumped")
        return as_output_list(dump.run_graph(self.fn, args, "eager"))

    def why_replays_cannot_be_dumped(self) -> str | None:
        if self.config.force_eager:
            return "force_eager"
        if self.blocker is not None:
            return self.blocker
        if not self.watches:
            return f"{self.runtime.name} graphs cannot be read between kernels"
        if self.kernels is not None:
            return "static kernels cannot be read between kernels"
        return None

    @property
    def watches(self) -> bool:
        """Whether captures keep every node's value, so that replays can be dumped."""
        return (
            self.dumper is not None
            and self.runtime.replays_watched
            and isinstance(self.fn, torch.fx.GraphModule)
        )

    def replayable(self, args: Sequence[Any]) -> CapturedKey | None:
        """The captured key this call would replay, or None."""
        entry = self.entries.get(self.layout.key_of(args))
        if entry is None or self.config.force_recapture:
            return None
        if self.layout.mutated_addresses(args) != entry.staged.mutated_addresses:
            return None
        return entry

    def check_frozen_parameters(self, entry: CapturedKey, args: Sequence[Any]) -> None:
        """The debug check of ``frozen_parameter``'s promise (logger ``npugraph_ex`` at DEBUG)."""
        index = self.layout.moved_parameter(args, entry.staged.parameter_addresses)
        if index is None:
            return
        raise CaptureError(
            f"{self.stats.name}: parameter or buffer input {index} moved since {entry.label} was "
            "captured, and with frozen_parameter=True the replay would read its old memory. "
            "Update parameters in place (param.copy_(new)), or set "
            "options={'frozen_parameter': False} to key graphs on their addresses."
        )

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

    def graph_for(self, args: Sequence[Any]) -> Callable[..., Any]:
        """What to run for ``args``' sizes: the graph with its few-row products split where the
        specialiser says so, else the graph as compiled."""
        if self.specialiser is None:
            return self.fn
        specialised = self.specialiser.graph_for(args, self.stats.key_specialisation)
        return self.fn if specialised is None else specialised

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
            self.forget(old)
        staged = self.layout.stage(args, clone_input=self.config.clone_input)
        key = self.layout.stored_key(key)
        pool = self.pools.for_new_key()
        # Kernels compile outside the locks: a compile may take minutes, and reads no input data.
        fn, how = self.kernels_for(staged.args)
        started = time.perf_counter()
        label = f"key{self.captures_made}: {self.layout.describe(key)}"
        folder = debug_folder(self.config, self.stats.name)
        with (
            self.runtime.pool_lock(pool),
            profiled("capture", self.stats.name, label),
            compile_log(folder),
        ):
            try:
                graph = self.capture_staged(staged, pool, fn, how)
            except Exception as error:  # any failure to capture falls back to eager
                return self.after_failed_capture(args, error)
            self.stats.capture_seconds += time.perf_counter() - started
            self.captures_made += 1
            entry = CapturedKey(label, graph, staged, pool)
            self.entries[key] = entry
            self.count_capture(key, entry, recapture_reason)
            if self.runtime.capture_executes:
                outputs, graph.capture_outputs = graph.capture_outputs, None
            else:
                outputs = graph.replay()
            return self.for_caller(outputs, staged.args)

    def count_capture(self, key: tuple, entry: CapturedKey, recapture_reason: str | None) -> None:
        info = {"kernels": entry.graph.kernel_count, "pool_bytes": entry.graph.pool_bytes}
        self.stats.captured(entry.label, info, recapture_reason)
        log.debug("%s: captured %s (%s)", self.stats.name, entry.label, info)
        if recapture_reason is None:
            self.notice_value_keys(key)
        folder = debug_folder(self.config, self.stats.name)
        if folder is not None:
            write_capture_summary(folder, entry.label, entry.graph)

    def after_failed_capture(self, args: list[Any], error: Exception) -> list[Any]:
        """Run the call eagerly. If eager fails too, the call itself is bad (an index out of
        range): its error reaches the caller and capture stays on for the next call. Else the
        graph cannot be captured, and every later call runs eagerly (or raises when strict)."""
        try:
            outputs = self.run_eager(args, "capture failed")
        except Exception:
            log.debug("%s: a call failed eagerly too; capture stays on", self.stats.name)
            raise
        self.refuse(f"capture failed: {type(error).__name__}: {first_line(error)}")
        if self.config.strict_capture:
            raise self.strict_error() from error
        return outputs

    def capture_staged(
        self, staged: io.StagedInputs, pool: Any, fn: Callable[..., Any], how: Callable[..., Any]
    ) -> CapturedGraph:
        """Warm up, undo the warm-up's writes, then capture ``fn`` with ``how`` (which may itself
        execute)."""
        iters = self.config.num_warmup_iters
        # Undo warm-up writes, and the partial writes of a capture that fails while executing.
        undoable = iters or self.runtime.capture_executes
        saved = io.snapshot(staged.args, self.layout.mutated) if undoable else []
        lock = GLOBAL_CAPTURE_LOCK if self.config.capture_error_mode == "global" else None
        try:
            if lock is not None:
                lock.acquire()
            if iters:
                self.runtime.warmup(fn, staged.args, iters)
                io.restore(saved)
            owned = tuple(i for i, _ in staged.copies) if self.config.clone_input else ()
            return how(
                fn,
                staged.args,
                pool=pool,
                capture_error_mode=self.config.capture_error_mode,
                owned_inputs=owned,
            )
        except Exception:
            io.restore(saved)
            raise
        finally:
            if lock is not None:
                lock.release()

    def kernels_for(self, args: Sequence[Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """What to capture for this key, and how: compiled kernels when asked for and the key
        is chosen (``static_kernel_sym_values``), else ``fn``.

        A key whose kernels fail to compile captures the ATen graph instead, and says why once.
        """
        if self.kernels is not None and not self.kernels.wants(args):
            self.stats.static_kernels["not chosen"] += 1
        elif self.kernels is not None:
            return self.compiled_kernels_for(args)
        if self.watches:
            return WatchedRun(self.fn), self.runtime.capture
        return self.graph_for(args), self.runtime.capture

    def compiled_kernels_for(
        self, args: Sequence[Any]
    ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        try:
            fn, outcome = self.kernels.compile(args)
        except Exception as error:  # Inductor may fail on any op; the ATen graph still works
            self.stats.static_kernels["failed"] += 1
            log_once(
                log,
                logging.WARNING,
                ("static kernels", self.number, type(error).__name__),
                "npugraph_ex: %s: static_kernel_compile failed (%s: %s); this key captures the "
                "ATen graph instead",
                self.stats.name,
                type(error).__name__,
                first_line(error),
            )
            return self.fn, self.runtime.capture
        self.stats.static_kernels[outcome] += 1
        return fn, self.runtime.capture_compiled

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
            for key, entry in self.entries.items()
            if entry.staged.parameter_addresses != current and not entry.staged.parameters_current()
        ]
        for key in stale:
            self.forget(self.entries.pop(key), dropped="parameters replaced")

    def forget(self, entry: CapturedKey, dropped: str | None = None) -> None:
        """Release a key; ``dropped`` says why, where the graph lives on without it."""
        if dropped is None:
            self.stats.keys.pop(entry.label, None)
        else:
            self.stats.dropped(entry.label, dropped)
        entry.graph.release()

    def strict_error(self) -> UnsupportedGraphError:
        return UnsupportedGraphError(
            f"{self.stats.name} cannot be captured: {self.blocker}. Set "
            "options={'strict_capture': False} to run it eagerly instead."
        )

    def refuse(self, reason: str) -> None:
        """Stop capturing this graph: every later call runs eagerly (or raises when strict)."""
        self.blocker = reason
        if self.config.strict_capture:
            return
        log_once(
            log,
            logging.WARNING,
            ("refuse", self.number, reason),
            "npugraph_ex: %s runs eagerly, not captured: %s",
            self.stats.name,
            reason,
        )

    def warn_limit(self) -> None:
        log_once(
            log,
            logging.WARNING,
            ("limit", self.number),
            "npugraph_ex: %s reached capture_limit=%d; new shapes run eagerly while the %d "
            "captured ones keep replaying. Raise options={'capture_limit': N} to capture more.",
            self.stats.name,
            self.config.capture_limit,
            len(self.entries),
        )

    def notice_value_keys(self, key: tuple) -> None:
        """Say once when ``VALUE_KEYS_NOTICE`` keys differ only in the values of int inputs (ints
        that are only data left the graph in the ``split_host_ints`` pass; these are baked)."""
        same = self.layout.without_values(key)
        siblings = [k for k in self.entries if self.layout.without_values(k) == same]
        if len(siblings) < VALUE_KEYS_NOTICE:
            return
        log_once(
            log,
            logging.WARNING,
            ("value keys", self.number),
            "npugraph_ex: %s has captured %d keys that differ only in the values of its int "
            "inputs (%s): each new value is a new capture, and only values seen before replay. "
            "These ints reach kernels as ints (a shift, a size, a bound), which a capture holds "
            "as constants; one the model changes on every call makes every call a capture. "
            "Pass it as a tensor where the model allows it (see 'Int inputs' in docs/guide.md).",
            self.stats.name,
            len(siblings),
            "; ".join(self.layout.describe_values(k) for k in siblings),
        )

    def release(self) -> None:
        for entry in self.entries.values():
            self.forget(entry)
        self.entries.clear()
