"""Code shared by the benchmark scripts: interleaved timing, the environment record, output
(tables, JSON, bar charts).

Every ratio a benchmark reports comes from one process and one loop: each repeat runs one timed
block of every variant in turn (A, B, C, A, B, C, ...), so drift in clock speed, cache state or
neighbouring load hits all variants alike. A variant's figure is the median of its repeats; the
raw per-repeat times are written to the JSON record so the spread can be checked.

What ``npugraph-ex bench`` shares with these scripts lives in ``npugraph_ex.bench`` and is
re-exported here (the bar charts from ``npugraph_ex.bench.plotting``, which imports matplotlib
only when it draws); what only the scripts use (the shared flags, the profiler, reading one bare
captured graph) stays in this file.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.bench import plotting
from npugraph_ex.bench.environment import (
    apply_threads,
    cpu_model,
    environment,
    environment_line,
    package_version,
    source_commit,
)
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.bench.plotting import PALETTE, Panel
from npugraph_ex.bench.presets import QWEN3_MODELS, QWEN3_PRESETS
from npugraph_ex.bench.records import run_record
from npugraph_ex.bench.records import write_json as write_record
from npugraph_ex.bench.settling import UNSETTLED, KeyStates
from npugraph_ex.bench.tables import cell_text, format_table
from npugraph_ex.bench.timing import Block, interleaved, median, scaled, spread, time_calls
from npugraph_ex.capture.inputs import refresh

__all__ = [
    "PALETTE",
    "QWEN3_MODELS",
    "QWEN3_PRESETS",
    "Block",
    "Panel",
    "add_common_args",
    "add_settling_args",
    "apply_threads",
    "aten_self_times",
    "bar_panels",
    "calls_through",
    "captured_graph",
    "cell_text",
    "cpu_model",
    "environment",
    "environment_line",
    "format_table",
    "interleaved",
    "kernels_per_replay",
    "live_graph_numbers",
    "manager_arguments",
    "median",
    "qwen3_token_forward",
    "package_version",
    "print_heading",
    "scaled",
    "settings_of",
    "settled_times",
    "source_commit",
    "spread",
    "step_loop",
    "time_calls",
    "with_inputs",
    "write_json",
]


BUSY_KEY_STATES = set(UNSETTLED) - {"aten"}
"""Key states of a compile queued, running or on trial: a key never hot ("aten") has none."""


def per_call(fn: Callable[[], Any], calls: int) -> Callable[[], float]:
    """A timed block for ``interleaved``: ``calls`` calls of ``fn``, seconds per call."""

    def block() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls

    return block


def settle_keys(call: Callable[[], Any], managers: list[Any], calls: int, limit_s: float) -> dict:
    """Call at least ``calls`` times, then until no key of ``managers`` waits for, compiles or
    tries its kernels (at most ``limit_s``); the keys' states."""
    states = KeyStates(managers)
    started = time.perf_counter()
    made = 0
    while True:
        call()
        made += 1
        busy = BUSY_KEY_STATES & set(states())
        if made >= calls and (not busy or time.perf_counter() - started > limit_s):
            return states()
        time.sleep(0.01)


def add_settling_args(parser: argparse.ArgumentParser) -> None:
    """``--calls``, ``--warmup-calls`` and ``--settle-s``, read by ``settled_times``."""
    parser.add_argument("--calls", type=int, default=20, help="calls per timed block")
    parser.add_argument("--warmup-calls", type=int, default=30, help="calls before timing")
    parser.add_argument(
        "--settle-s", type=float, default=120.0, help="longest wait for the kernel tier"
    )


def settled_times(
    calls: dict[str, tuple[Callable[[], Any], list[Any]]], args: argparse.Namespace, label: str
) -> dict[str, list[float]]:
    """Each form's call (with the capture managers of its graphs) called until its keys settle
    (``settle_keys``; their states printed), then the forms timed interleaved: seconds a call,
    per repeat."""
    for name, (call, managers) in calls.items():
        states = settle_keys(call, managers, args.warmup_calls, args.settle_s)
        print(f"{label}, {name}: keys {states}", flush=True)
    blocks = {name: per_call(call, args.calls) for name, (call, _) in calls.items()}
    return interleaved(blocks, args.repeats)


def captured_graph(before: set[int]) -> tuple[Any, Any]:
    """The capture manager created since ``before`` that replays, and its one captured graph.

    That is the one manager holding a capture, or, where a step compiled to several graphs (a
    first call that Dynamo specialised, then the graph of every later call), the one of them that
    has replayed most. Raises when that manager holds more than one key: the bare replay timed
    next to a compiled call must be the graph that call replays.
    """
    live = [m for m in managers_since(before) if m.entries]
    if len(live) > 1:
        live = [max(live, key=lambda m: m.stats.replays)]
    if len(live) != 1 or len(live[0].entries) != 1:
        keys = [len(m.entries) for m in live]
        raise RuntimeError(f"expected one replaying graph with one key, found keys {keys}")
    manager = live[0]
    return manager, next(iter(manager.entries.values())).graph


def manager_arguments(managers: list[Any], call: Callable[[], Any]) -> tuple[Any, list[Any]]:
    """The capture manager ``call`` runs (an earlier call may have left others behind) and the
    arguments ``call`` gives it, kept from one call. Called alone on them, the manager does the
    key lookup, input copies, replay and outputs, without Dynamo's frame or the wrapper."""
    kept: dict[int, list[Any]] = {}

    def keeping(index: int) -> Callable[[Callable[[list[Any]], Any]], Callable[..., Any]]:
        return lambda run: lambda args: kept.setdefault(index, list(args)) and run(args)

    with contextlib.ExitStack() as stack:
        for index, manager in enumerate(managers):
            stack.enter_context(calls_through(manager, keeping(index)))
        call()
    ((index, args),) = kept.items()
    return managers[index], args


@contextlib.contextmanager
def calls_through(
    manager: Any, wrap: Callable[[Callable[[list[Any]], Any]], Callable[[list[Any]], Any]]
) -> Iterator[None]:
    """Inside the block, a call of ``manager`` (as the wrappers make it, ``manager(args)``) runs
    ``wrap(the manager's own call)(args)``; other managers are untouched. Python looks the call
    up on the class, so the class's ``__call__`` is replaced for the block."""
    manager_class = type(manager)
    original = manager_class.__call__
    wrapped = wrap(lambda args: original(manager, args))

    def dispatch(self: Any, args: list[Any]) -> Any:
        return wrapped(args) if self is manager else original(self, args)

    manager_class.__call__ = dispatch
    try:
        yield
    finally:
        manager_class.__call__ = original


@contextlib.contextmanager
def attributes_set(target: Any, settings: dict[str, Any]) -> Iterator[None]:
    """Inside the block, each ``name: value`` of ``settings`` is set on ``target`` (a module's
    tuning constant, say); the values before are put back after it."""
    before = {name: getattr(target, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(target, name, value)
        yield
    finally:
        for name, value in before.items():
            setattr(target, name, value)


def with_inputs(manager: Any, args: list[Any], run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` (a bare replay or step loop of ``manager``'s one key) after copying ``args`` into
    the key's input buffers, as a replay through the manager does: the buffers share the pool's
    bytes with the graph's intermediates, so a bare run without the copy reads stale values."""
    copies = next(iter(manager.entries.values())).staged.copies

    def run_with_inputs() -> Any:
        refresh(copies, args)
        return run()

    return run_with_inputs


def step_loop(graph: Any, keep: Callable[[str], bool] | None = None) -> Callable[[], None]:
    """A CPU graph's recorded steps run by a plain loop over ``(fn, args, kwargs)``: the same
    kernels on the same tensors as ``graph.replay()``, without its generated function
    (``npugraph_ex/runtime/cpu/program.py``); with ``keep``, only the steps whose name
    (``graph.step_names``) it accepts. Call after a replay of the graph's key, so its memory is
    in place."""
    steps = list(graph.steps)
    if keep is not None:
        steps = [s for name, s in zip(graph.step_names, steps, strict=True) if keep(name)]

    def run() -> None:
        with torch._C._AutoDispatchBelowADInplaceOrView():
            for fn, args, kwargs in steps:
                fn(*args, **kwargs)

    return run


def aten_self_times(fn: Callable[[], Any], calls: int) -> tuple[dict[str, float], float]:
    """Self CPU seconds per call of ``fn`` in each ATen op under torch.profiler, and wall seconds.

    Self time leaves out the Python-to-C++ call of each op; the profiler adds a little of its own
    cost to every op it records, and the wall time (of the same profiled calls) includes it.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = (time.perf_counter() - start) / calls
    by_op = {
        event.key: event.self_cpu_time_total * 1e-6 / calls
        for event in prof.key_averages()
        if event.key.startswith("aten::")
    }
    return by_op, wall


def kernels_per_replay(summary: dict[str, Any], graph: Any) -> int | None:
    """Kernels one replay launches, as the graph's stats report it (the graph's own count else).

    Reads ``kernels_per_replay`` (by key) or, where the summary lists its ``keys``, their
    ``kernels``; a graph with one live key has one figure.
    """
    counts = list(summary.get("kernels_per_replay", {}).values())
    counts += [info["kernels"] for info in summary.get("keys", {}).values() if "kernels" in info]
    if len(counts) == 1:
        return counts[0]
    return getattr(graph, "kernel_count", None)


def qwen3_token_forward() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The tiny Qwen3's one-token forward without a cache (random weights, eval mode), as a
    function of the token ids, and one token's ids."""
    from transformers import AutoModelForCausalLM

    from npugraph_ex.bench.presets import qwen3_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_config("tiny")).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 1))
    return lambda ids: model(ids, use_cache=False).logits, (ids,)


def add_common_args(parser: argparse.ArgumentParser, name: str, repeats: int) -> None:
    """``--repeats``, ``--threads`` and ``--out``, shared by every script."""
    parser.add_argument(
        "--repeats", type=int, default=repeats, help=f"timed rounds (default {repeats})"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results") / f"{name}.json",
        help=f"JSON record to write (default bench-results/{name}.json)",
    )


def print_heading(title: str) -> None:
    """A report's first lines: a blank line, the host and versions, ``title``."""
    print()
    print(environment_line(environment()))
    print(title)


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """A script's parsed flags for its JSON record (paths as text)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def bar_panels(panels: list[Panel], path: Path, *, title: str, unit: str, ylabel: str) -> None:
    """Write a PNG with one bar panel per workload side by side, and say where."""
    written = plotting.bar_panels(panels, path, title=title, unit=unit, ylabel=ylabel)
    print(f"wrote {written}")


def write_json(path: Path, name: str, settings: dict[str, Any], results: Any) -> None:
    """Write the record of one run: the benchmark, its settings, the environment, the results."""
    record = run_record(name, settings)
    record["results"] = results
    print(f"wrote {write_record(path, record)}")
