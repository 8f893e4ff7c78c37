"""What this host's kernels are good at, measured once per process: the choices that depend on it.

Three rewrites of matrix products pay only on some hosts: where ATen's ``mm`` leaves threads
idle or runs an unvectorised kernel (MKL on the AMD CPU they were measured on: one row 2x to 5x
below what reading the weight allows, a few to a few hundred rows a third to a half of its rate
on large matrices), not where the BLAS already streams the weight at memory speed. No version
check or CPU name tells which a host is; a measurement does:

- ``split_pays``: the default path's split of a product over the intra-op threads
  (``passes/patterns/row_products.py``) against ``mm``;
- ``reduction_pays``: ``static_kernel_compile``'s multiply-and-sum (``kernels/decompositions``),
  judged by how far ``mm`` is from a row sum that reads the same weights once (what the
  generated reduction does), both on one thread, per dtype: ATen runs each dtype's ``mm`` with
  another kernel (here float32 1.6x to 2.0x, also under load, bfloat16 about 2x, float16 1.6x);
- ``linear_pays``: oneDNN's linear kernel from the plain weight
  (``passes/patterns/onednn_linear.py``) against ``mm``, at each of ``LINEAR_PROBE_ROWS`` (1.14x
  to 1.62x at every count here, where MKL runs its generic path; on its Intel paths 0.6x to 0.9x
  below 16 rows and from 64, 2.1x to 2.7x between).

Each runs at the first compile that could use it, once per thread count: ``PROBE_WEIGHTS``
products (one row; ``LINEAR_PROBE_ROWS`` for oneDNN) by weights larger than the CPU caches,
against the other form, interleaved, the fastest of ``PROBE_ROUNDS`` rounds each (another
process busy on the cores slows some rounds, not all); a rewrite is kept only with a clear gain
(``SPLIT_GAIN``, ``REDUCTION_GAIN``, ``LINEAR_GAIN``). About 50 ms each on the reference
machine, 0.5 s for oneDNN's six row counts; the ``npugraph_ex`` logger says at INFO what it
measured. A compile process of the kernel tier takes the serving process's results with each
request (``answers``, ``take_answers``) and measures only what the serving process has not.
The CPU platform (``runtime/cpu/platform.py``) asks them, with the rest of each decision.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import _disable_current_modes

from npugraph_ex.compat import onednn_linear_op

log = logging.getLogger(__name__)

Measured = TypeVar("Measured")

PROBE_WEIGHTS = 8
PROBE_SHAPE = (1024, 512)
"""Each probe weight: 2 MiB of float32; eight of them (16 MiB; as many bytes of narrower dtypes)
stream from memory, as the layers of a model larger than the caches do."""
PROBE_ROUNDS = 7
REDUCTION_NAMES = {
    torch.float32: "reduction",
    torch.bfloat16: "reduction_bfloat16",
    torch.float16: "reduction_float16",
}
"""The dtypes whose reduction probe a benchmark's record lists, and its names there."""
SPLIT_GAIN = 1.1
REDUCTION_GAIN = 1.15
"""The reduction also multiplies, and Inductor's version of it is not the row sum timed here.
Measured on the tiny Qwen3 decode step and one-token forward where MKL serves one row well, the
reduction forced on against forced off: static kernels gain 1.1x to 1.4x more over eager with it
(probe readings 1.32x to 1.55x); the probe there read 1.24x to 1.6x over eight runs."""
LINEAR_GAIN = 1.1
LINEAR_PROBE_ROWS = (4, 8, 16, 32, 64, 128)
"""Row counts oneDNN's probe times, each standing for the counts up to the next. Which form wins
depends on the count, not only on the host: on MKL's Intel code paths oneDNN ran products of 4
rows at 0.3x to 0.4x of ``mm`` and of 16 rows at 1.35x to 3.3x
(``benchmarks/mkl_intel_path.py``)."""


@dataclass(frozen=True)
class Probe:
    """``mm`` against another form of the same reads, at ``threads`` intra-op threads."""

    threads: int
    mm_ms: float
    other_ms: float
    needed: float
    """The gain the other form must show to be used."""

    @property
    def gain(self) -> float:
        """How many times faster the other form ran (0 where nothing was timed)."""
        return self.mm_ms / self.other_ms if self.other_ms else 0.0

    @property
    def pays(self) -> bool:
        return self.gain >= self.needed


def split_pays() -> bool:
    """Whether few-row products should be split over the threads, at the current thread count."""
    return split_probe(torch.get_num_threads()).pays


def reduction_pays(dtype: torch.dtype = torch.float32) -> bool:
    """Whether few-row products of ``dtype`` should become reductions, at the current thread
    count."""
    return reduction_probe(torch.get_num_threads(), dtype).pays


def linear_pays(rows: int | None = None) -> bool:
    """Whether products of ``rows`` rows should run through oneDNN's linear kernel, at the
    current thread count (``rows`` None: of some row count, as a symbolic one may be)."""
    probes = linear_probe(torch.get_num_threads())
    if rows is None:
        return any(probe.pays for probe in probes.values())
    band = max((count for count in probes if count <= rows), default=None)
    return band is not None and probes[band].pays


def decisions() -> dict[str, dict[str, float | bool]]:
    """What the probes measured at the current thread count (measuring them if not yet), for a
    benchmark's record of where it ran."""
    threads = torch.get_num_threads()
    linear = {f"onednn_linear_{rows}": probe for rows, probe in linear_probe(threads).items()}
    return {
        name: {
            "mm_ms": round(result.mm_ms, 4),
            "other_ms": round(result.other_ms, 4),
            "gain": round(result.gain, 2),
            "used": result.pays,
        }
        for name, result in (
            ("split", split_probe(threads)),
            *(
                (REDUCTION_NAMES[dtype], reduction_probe(threads, dtype))
                for dtype in REDUCTION_NAMES
            ),
            *linear.items(),
        )
    }


MEASURED: dict[tuple[Any, ...], Any] = {}
"""Each probe's result, by the probe's name, the thread count and (for those that take one) the
dtype: measured in this process, or taken from the serving process (``take_answers``)."""


def answers() -> dict[tuple[Any, ...], Any]:
    """What this process measured so far: sent with each compile request, so that a compile
    process decides as the serving process, which runs the kernels, did."""
    return dict(MEASURED)


def take_answers(measured: dict[tuple[Any, ...], Any]) -> None:
    """In a compile process: the serving process's measurements, in place of its own. Measured
    there, a probe would read other numbers (one core, the serving process's threads on it, the
    serving loop beside it) and take seconds of the compile."""
    MEASURED.update(measured)


def on_real_tensors(probe: Callable[..., Measured]) -> Callable[..., Measured]:
    """Run ``probe`` once per thread count (and dtype, for those that take one), on real tensors
    even when called under a dispatch mode (a pass that checks a match may run under the
    compile's fake tensor mode)."""

    @functools.wraps(probe)
    def run(threads: int, *dtype: torch.dtype) -> Measured:
        key = (probe.__name__, threads, *dtype)
        if key not in MEASURED:
            with _disable_current_modes():
                MEASURED[key] = probe(threads, *dtype)
        return MEASURED[key]

    return run


@on_real_tensors
def split_probe(threads: int) -> Probe:
    if threads < 2:
        return Probe(threads, 0.0, 0.0, SPLIT_GAIN)  # nothing to split over: never pays
    weights, x = probe_operands()
    rows, depth = PROBE_SHAPE
    columns = x.t().unsqueeze(0).expand(threads, depth, 1)
    blocks = [w.view(threads, rows // threads, depth) for w in weights]
    outputs = [torch.empty(threads, rows // threads, 1) for _ in weights]

    def split() -> None:
        for block, out in zip(blocks, outputs, strict=True):
            torch.bmm(block, columns, out=out)

    return measured("split over the threads", threads, (weights, x), split, SPLIT_GAIN)


@on_real_tensors
def reduction_probe(threads: int, dtype: torch.dtype = torch.float32) -> Probe:
    """Measured on one thread whatever ``threads`` is: the question is whether ``mm``'s kernel
    reads a weight slower than a plain vectorised reduction does, and one thread each answers
    it without the other cores' load in the answer (two threads' rounds under another process's
    load varied by 2x; one thread's by 15%). Half-precision rows are summed in their dtype: ATen
    accumulates them in float32 in registers, as the generated reduction does (asked to sum
    into float32, ATen converts the whole weight first, at a third of the speed)."""
    weights, x = probe_operands(dtype=dtype)
    outputs = [torch.empty(PROBE_SHAPE[0], dtype=dtype) for _ in weights]

    def row_sums() -> None:
        for w, out in zip(weights, outputs, strict=True):
            torch.sum(w, dim=1, out=out)

    form = f"a reduction over the weight's rows ({dtype}, one thread each)"
    torch.set_num_threads(1)
    try:
        return measured(form, 1, (weights, x), row_sums, REDUCTION_GAIN)
    finally:
        torch.set_num_threads(threads)


@on_real_tensors
def linear_probe(threads: int) -> dict[int, Probe]:
    """oneDNN against ``mm`` at each of ``LINEAR_PROBE_ROWS``."""
    return {rows: linear_probe_at(threads, rows) for rows in LINEAR_PROBE_ROWS}


def linear_probe_at(threads: int, rows: int) -> Probe:
    linear = onednn_linear_op()
    if linear is None:
        return Probe(threads, 0.0, 0.0, LINEAR_GAIN)  # no oneDNN in this build: never pays
    weights, x = probe_operands(rows)

    def with_onednn() -> None:
        for w in weights:
            linear(x, w, None, "none", [], "")

    form = f"oneDNN's linear ({rows} rows)"
    return measured(form, threads, (weights, x), with_onednn, LINEAR_GAIN)


def probe_operands(
    rows: int = 1, dtype: torch.dtype = torch.float32
) -> tuple[list[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    count = PROBE_WEIGHTS * 4 // dtype.itemsize  # as many bytes as float32's weights
    weights = [torch.randn(*PROBE_SHAPE, generator=generator).to(dtype) for _ in range(count)]
    return weights, torch.randn(rows, PROBE_SHAPE[1], generator=generator).to(dtype)


def measured(
    form: str,
    threads: int,
    operands: tuple[list[torch.Tensor], torch.Tensor],
    other: Callable[[], None],
    needed: float,
) -> Probe:
    """Time ``mm`` of ``operands`` (weights, the rows they multiply) against ``other``, which
    reads the same weights."""
    weights, x = operands
    outputs = [torch.empty(x.shape[0], PROBE_SHAPE[0], dtype=x.dtype) for _ in weights]

    def with_mm() -> None:
        for w, out in zip(weights, outputs, strict=True):
            torch.mm(x, w.t(), out=out)

    times: dict[str, list[float]] = {"mm": [], "other": []}
    with torch.no_grad():
        for _ in range(PROBE_ROUNDS + 1):  # the first round warms up
            for name, run in (("mm", with_mm), ("other", other)):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    mm_ms, other_ms = (min(times[name][1:]) * 1e3 for name in ("mm", "other"))
    result = Probe(threads, mm_ms, other_ms, needed)
    log.info(
        "npugraph_ex: %d-row products at %d threads: mm %.3f ms, %s %.3f ms (%.2fx): %s",
        x.shape[0],
        threads,
        mm_ms,
        form,
        other_ms,
        result.gain,
        "used" if result.pays else "left to mm",
    )
    return result
