"""Running one workload: every variant's first run in turn, then all of them timed interleaved.

First runs go one variant at a time (each pays its own compilation and captures, and its
memory is measured alone); a variant that settles runs until it has settled right after its
first run, before the next variant starts, so its background compiles overlap no other
variant's first run and its time to steady speed counts no other variant's work. The steady
figures then come from one interleaved loop over all of them, so every ratio is measured side
by side. Eager runs first: it is every ratio's baseline and the reference for the greedy
tokens. A compiled variant whose first run or settling raises (a peer backend that cannot
compile the model on this device, a background compile that failed) is reported as failed,
with its error, and left out of the timing; the others still run.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from npugraph_ex.bench.graphs import CaptureSummary, live_graph_numbers, managers_since, summarise
from npugraph_ex.bench.inductor_async import Swaps
from npugraph_ex.bench.memory import MemoryMeter
from npugraph_ex.bench.progress import Progress
from npugraph_ex.bench.settling import CallTimes, KeyStates, Settling, Watched, settle
from npugraph_ex.bench.timing import interleaved, median, spread
from npugraph_ex.bench.variants import BASELINE, VARIANTS, Variant
from npugraph_ex.bench.workload import Agreement, Generation, Run, Workload, agreement
from npugraph_ex.errors import first_line

FIELDS = (
    "first_call_s",
    "tokens_per_s",
    "per_repeat_s",
    "spread",
    "speedup_vs_eager",
    "captured_keys",
    "peak_memory_bytes",
    "pool_bytes",
    "tokens_match_eager",
    "tokens_agree",
    "tokens_checked",
    "max_abs_logit_diff",
)
"""Every variant's figures in the JSON record (all None, plus ``error``, for a failed one); a
variant that settles adds ``settling.Settling.record()``'s."""

SETTLE_LIMIT_S = 600.0
"""Longest a variant may take to settle before it is timed as it is."""


@dataclass
class VariantResult:
    """One variant's figures on one workload."""

    variant: Variant
    first_call_s: float
    memory_bytes: int
    generation: Generation
    per_repeat_s: list[float]
    capture: CaptureSummary | None = None
    agreement: Agreement | None = None
    settling: Settling | None = None


@dataclass
class WorkloadResult:
    workload: Workload
    variants: dict[str, VariantResult]
    failed: dict[str, str]
    """Variants whose first run raised, and the error."""
    compile_args: dict[str, dict[str, Any] | None]

    def tokens_per_s(self, name: str) -> float:
        return self.workload.block_tokens / median(self.variants[name].per_repeat_s)

    def speedup(self, name: str) -> float:
        runs = self.variants
        return median(runs[BASELINE].per_repeat_s) / median(runs[name].per_repeat_s)

    def record(self) -> dict[str, Any]:
        """The workload's part of the JSON record."""
        figures = {name: self.variant_record(name) for name in self.variants}
        for name, error in self.failed.items():
            figures[name] = {**dict.fromkeys(FIELDS), "error": error}
        return {
            **self.workload.describe(),
            "compile_args": {
                "fullgraph": True,
                "dynamic": self.workload.dynamic,
                "by_variant": self.compile_args,
            },
            "variants": {name: figures[name] for name in self.compile_args},
            "eager_tokens": self.variants[BASELINE].generation.tokens,
        }

    def variant_record(self, name: str) -> dict[str, Any]:
        result = self.variants[name]
        match = result.agreement
        checked = len(result.generation.tokens)
        return {
            "first_call_s": round(result.first_call_s, 4),
            "tokens_per_s": round(self.tokens_per_s(name), 2),
            "per_repeat_s": [round(t, 6) for t in result.per_repeat_s],
            "spread": round(spread(result.per_repeat_s), 4),
            "speedup_vs_eager": round(self.speedup(name), 4),
            "captured_keys": result.capture.keys if result.capture else None,
            "peak_memory_bytes": result.memory_bytes,
            "pool_bytes": result.capture.pool_bytes if result.capture else None,
            "tokens_match_eager": match.all_agree if match else True,
            "tokens_agree": match.agree if match else checked,
            "tokens_checked": match.checked if match else checked,
            "max_abs_logit_diff": match.max_abs_logit_diff if match else 0.0,
            **(result.settling.record() if result.settling else {}),
        }


def warm_up(device: str) -> None:
    """Pay torch.compile's one-time costs (imports, first Dynamo and AOTAutograd use) up front.

    Without this the first compiled variant's first-call figure would include them and the
    others' would not; a two-op function through npugraph_ex touches the same machinery.
    """
    fn = torch.compile(lambda x: x * 2 + 1, backend="npugraph_ex", fullgraph=True)
    fn(torch.ones(4, device=device))


@dataclass
class FirstRun:
    run: Run
    result: VariantResult
    managers: list[Any]
    calls: CallTimes | None = None
    """Times each call while the variant settles (a variant that settles only)."""
    watched: Watched | None = None
    """What the variant settles by (a variant that settles only)."""


def compile_args(workload: Workload, variant: Variant) -> dict[str, Any] | None:
    if not variant.compiled:
        return None
    return variant.compile_args(
        dynamic=workload.dynamic, npugraph_options=workload.npugraph_options()
    )


def first_run(workload: Workload, variant: Variant, device: str, progress: Progress) -> FirstRun:
    """Prepare ``variant``'s step and run it the first time, measuring time and memory."""
    args = compile_args(workload, variant)
    prepared = variant.prepare(workload.step(), args)  # compiles lazily, at the first call
    swaps = Swaps() if variant.async_subprocess else None  # counted from before its compile
    calls = CallTimes(prepared) if variant.settles else None
    run = workload.bind(calls or prepared)
    gc.collect()
    before = live_graph_numbers()
    meter = MemoryMeter(device)
    meter.start()
    label = f"{workload.name}: {variant.name}, {workload.first_label}"
    with progress.phase(label, total=workload.first_units) as advance:
        seconds, generation = run.first(advance)
    memory = meter.stop()
    managers = managers_since(before) if variant.captures else []
    result = VariantResult(variant, seconds, memory, generation, [])
    watched: Watched | None = swaps
    if watched is None and variant.settles:
        watched = KeyStates(managers)
    return FirstRun(run, result, managers, calls, watched)


def run_until_settled(first: FirstRun, name: str, workload: Workload, progress: Progress) -> None:
    """Run a variant that settles until it has, timing each call (``settling``); raises where
    what it watched says its figures would not be its own (``Watched.problem``)."""
    watched = first.watched
    if first.calls is None or watched is None:
        return
    with progress.phase(f"{workload.name}: {name}, until its {watched.what}s settle"):
        first.result.settling = settle(first.run.block, first.calls, watched, SETTLE_LIMIT_S)
    problem = watched.problem()
    if problem is not None:
        raise RuntimeError(problem)


def first_runs(
    workload: Workload, names: list[str], device: str, progress: Progress
) -> tuple[dict[str, FirstRun], dict[str, str]]:
    """Each variant's first run, and settling for one that settles, in turn; those of compiled
    variants that raise, by error."""
    firsts: dict[str, FirstRun] = {}
    failed: dict[str, str] = {}
    for name in names:
        try:
            first = first_run(workload, VARIANTS[name], device, progress)
            run_until_settled(first, name, workload, progress)
            firsts[name] = first
        except Exception as error:
            if name == BASELINE:
                raise
            failed[name] = f"{type(error).__name__}: {first_line(error)[:300]}"
            progress.note(f"{workload.name}: {name} left out: {failed[name]}")
    return firsts, failed


def run_workload(
    workload: Workload, names: list[str], *, repeats: int, device: str, progress: Progress
) -> WorkloadResult:
    """First runs of every variant, then ``repeats`` interleaved timed rounds after one warm-up."""
    firsts, failed = first_runs(workload, names, device, progress)
    blocks = {name: first.run.block for name, first in firsts.items()}
    label = f"{workload.name}: timing {len(blocks)} variants, {repeats} interleaved repeats"
    with progress.phase(label, total=repeats + 1) as advance:
        times = interleaved(blocks, repeats, warmup=1, after_round=advance)
    reference = firsts[BASELINE].result.generation
    results: dict[str, VariantResult] = {}
    for name, first in firsts.items():
        result = first.result
        result.per_repeat_s = times[name]
        if result.variant.captures:
            result.capture = summarise(first.managers)
        if name != BASELINE:
            result.agreement = agreement(reference, result.generation)
        results[name] = result
    args = {name: compile_args(workload, VARIANTS[name]) for name in names}
    return WorkloadResult(workload, results, failed, args)
