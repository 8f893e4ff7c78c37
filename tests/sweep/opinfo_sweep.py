"""PyTorch's OpInfo database run through ``backend="npugraph_ex"``, against ``aot_eager``.

For each OpInfo and dtype, up to ``limit`` CPU samples (of as many kinds as there are: tensor or
number arguments, 0-d, empty; from the first ``SAMPLE_POOL``; binary ops that take a Python number
get one such sample more) are called three times through ``torch.compile(backend="npugraph_ex")``
with default options (or ``--options``: ``static_kernel_compile=True`` runs every key on
Inductor's kernels): once with the OpInfo's sample (the capture), then twice with fresh inputs
(the replays: the sample regenerated under other seeds, every tensor's values renewed, the
structure kept). Every call is compared with ``backend="aot_eager"`` on copies of exactly the same
inputs, outputs and written inputs both, with ``torch.testing.assert_close``'s dtype defaults (NaN
equal). Everything runs under ``torch.no_grad()``. Each sample, then each op, lands in one class:

- ``equal``: every call matched, and nothing ran eagerly instead of replaying;
- ``no graph``: matched, but Dynamo handed no graph to the backend (a graph break around the
  only op, such as ``nonzero``'s data-dependent shape): nothing of ours ran;
- ``eager fallback``: matched, but a graph ran eagerly, with the reason ``npugraph_ex.stats()``
  counts and the reason its log gives;
- ``error``: ``npugraph_ex`` raised where ``aot_eager`` did not, or the process died;
- ``timeout``: the op's samples took longer than ``--timeout`` seconds in all;
- ``mismatch``: results differ from ``aot_eager``'s;
- ``as plain Inductor``: on static kernels (``--options static_kernel_compile=True``), results
  that differ from ``aot_eager``'s as ``backend="inductor"``'s own do (within tolerance of
  them): Inductor's numerics, not ours (bf16 arithmetic on a Python number kept in float32);
- ``reference fails``: ``aot_eager`` itself raised (not ours);
- ``skipped``: no samples, or outputs that differ between two runs of the reference itself.

Outputs of ``torch.empty`` and its kin are compared by layout only. Random ops are compared under
one seed, set before each call (in place of the OpInfo's own seeding, a graph break): the CPU
replay re-issues random ops from the generator eager draws from, so it draws what ``aot_eager``
draws.

An op's class is the worst of its samples' (error, timeout, mismatch, eager fallback, equal, no
graph, reference fails, skipped). Each OpInfo is swept as its function (``torch.add``) and, where
it has one, its operator (``operator.add``, which traces to other ATen ops: ``x << y`` is
``aten.__lshift__``, not ``bitwise_left_shift``); ``--variants inplace`` adds ``x.add_``.

Run as a script (``make sweep``) the whole database is swept in a child process, restarted past
any op that kills it, and a markdown table is written (``sweep_report.py``); ``--help`` lists the
flags.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import itertools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import types
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatch
from typing import Any

import torch
import torch._dynamo
import torch.utils._pytree as pytree

import npugraph_ex

EQUAL = "equal"
FALLBACK = "eager fallback"
ERROR = "error"
MISMATCH = "mismatch"
REFERENCE_FAILS = "reference fails"
SKIPPED = "skipped"
TIMEOUT = "timeout"
NO_GRAPH = "no graph"
AS_INDUCTOR = "as plain Inductor"
CLASSES = (
    ERROR,
    TIMEOUT,
    MISMATCH,
    FALLBACK,
    AS_INDUCTOR,
    EQUAL,
    NO_GRAPH,
    REFERENCE_FAILS,
    SKIPPED,
)
"""Worst first: an op takes the first class any of its samples has."""

CALLS = 3
"""Calls per sample: the capture, then two replays on fresh inputs."""
SEEDS = (0, 1, 2)
"""The seed each call's samples are generated with."""
RNG_SEED = 1234
"""Set before every call of either backend, so that random ops draw the same numbers."""

SAMPLE_POOL = 40
"""Samples generated per op and seed, from which the swept ones are spread over kinds."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
REASON_CHARS = 240

log = logging.getLogger(__name__)


@dataclass
class SampleResult:
    cls: str
    reason: str = ""
    graphs: int = 0
    captures: int = 0
    replays: int = 0
    kernels: int = 0
    """Keys that run compiled kernels (``static_kernel_compile=True`` in ``--options``)."""
    stale: bool = False
    """A replay reused the capture's values: renewed ones made the reference fail."""
    inexact: str = ""
    """Within tolerance but not bit-identical (the first difference): on CPU a replay re-runs the
    reference's kernels, so only a fusion pattern should change bits."""


@dataclass
class OpResult:
    name: str
    dtype: str
    dynamic: bool
    cls: str
    reason: str = ""
    samples: dict[str, int] = field(default_factory=dict)
    graphs: int = 0
    captures: int = 0
    replays: int = 0
    kernels: int = 0
    stale: int = 0
    inexact: str = ""
    seconds: float = 0.0


VARIANTS = {
    "function": "op",
    "operator": "operator_variant",
    "inplace": "inplace_variant",
    "intermediate": "op",
}
"""Which callable of an OpInfo is compiled: ``torch.add``, ``operator.add`` (``x + y`` and
``x << y`` trace to the dunder ATen ops, not to ``add`` and ``bitwise_left_shift``), ``x.add_``,
or (``intermediate``) ``torch.add`` between copies of its inputs and of its outputs, so that
every tensor it reads and writes is one the graph made: a CPU replay places those in one arena,
one storage (a kernel that tells storages apart sees them all as one)."""
DEFAULT_VARIANTS = ("function", "operator")
UNINITIALISED = ("empty", "new_empty")
"""OpInfos whose outputs are uninitialised memory: compared by shape, dtype and strides."""


@dataclass(frozen=True)
class Target:
    """One callable of one OpInfo: the unit the sweep classifies."""

    op: Any
    variant: str

    @property
    def name(self) -> str:
        base = (
            f"{self.op.name}.{self.op.variant_test_name}"
            if self.op.variant_test_name
            else self.op.name
        )
        return base if self.variant == "function" else f"{base}[{self.variant}]"

    @property
    def has_values(self) -> bool:
        """False for ops whose outputs are uninitialised memory (``torch.empty``)."""
        return not self.op.name.startswith(UNINITIALISED)

    @property
    def fn(self) -> Callable[..., Any] | None:
        fn = getattr(self.op, VARIANTS[self.variant])
        if fn is None:
            return None
        return between_copies(unseeded(fn)) if self.variant == "intermediate" else unseeded(fn)


def between_copies(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called on copies of its tensor arguments, its tensor results copied."""

    def copied(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
        return pytree.tree_map_only(torch.Tensor, torch.clone, fn(*args, **kwargs))

    return copied


def call_plainly(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def unseeded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` without OpInfo's ``wrapper_set_seed``, which seeds the generator inside the call
    (a graph break: no random op would reach the backend). The sweep seeds before each call."""
    code = getattr(fn, "__code__", None)
    if code is None or "wrapper_set_seed" not in code.co_names:
        return fn
    names = {**fn.__globals__, "wrapper_set_seed": call_plainly}
    plain = types.FunctionType(code, names, fn.__name__, fn.__defaults__, fn.__closure__)
    plain.__kwdefaults__ = fn.__kwdefaults__
    return plain


def op_database() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def matches(name: str, pattern: str) -> bool:
    """``pattern`` is a name, or a glob with ``*`` and ``?`` (brackets are part of names)."""
    if "*" not in pattern and "?" not in pattern:
        return name == pattern
    return fnmatch(name, pattern.replace("[", "[[]"))


def select_targets(
    patterns: Sequence[str] = (),
    dtype: torch.dtype = torch.float32,
    variants: Sequence[str] = DEFAULT_VARIANTS,
) -> list[Target]:
    """The variants of the OpInfos that support ``dtype`` on CPU whose name (with or without the
    ``[variant]`` suffix) matches a pattern (all when none are given)."""
    chosen = []
    for op in op_database():
        if dtype not in op.supported_dtypes("cpu"):
            continue
        for variant in variants:
            target = Target(op, variant)
            if target.fn is None:
                continue
            base = target.name.split("[")[0]
            names = (target.name, base)
            if patterns and not any(matches(n, p) for n in names for p in patterns):
                continue
            chosen.append(target)
    return chosen


def seeded(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    with contextlib.suppress(ImportError):
        import numpy

        numpy.random.seed(seed)


def generate_samples(op: Any, dtype: torch.dtype, seed: int, count: int) -> list[Any]:
    """The OpInfo's first ``count`` samples under ``seed``. ``op.sample_inputs`` would reseed
    before each sample from the calling test's name (found by walking the stack, slowly), and
    so give the same values under every seed: its generator is called directly instead."""
    seeded(seed)
    samples = op.sample_inputs_func(op, "cpu", dtype, False)
    return list(itertools.islice(samples, count))


def call_parts(sample: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (sample.input, *sample.args), dict(sample.kwargs)


def structure(sample: Any) -> tuple[Any, ...]:
    """What two samples must share to stand for one graph key: tree, tensor metadata, values."""
    leaves, spec = pytree.tree_flatten(call_parts(sample))
    described = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            strides = leaf.stride() if leaf.layout == torch.strided else leaf.layout
            described.append(("tensor", leaf.shape, leaf.dtype, strides, leaf.is_conj()))
        else:
            described.append(("value", repr(leaf)))
    return (str(spec), tuple(described))


def kind(sample: Any) -> tuple[Any, ...]:
    """Samples of one kind call the op the same way: tensor or number in each place, 0-d or not."""
    leaves, spec = pytree.tree_flatten(call_parts(sample))
    kinds = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            kinds.append(("tensor", leaf.dtype, leaf.dim() == 0, leaf.numel() == 0))
        else:
            kinds.append(type(leaf).__name__)
    return (str(spec), tuple(kinds))


def spread(samples: Sequence[Any], limit: int) -> list[int]:
    """Indices of up to ``limit`` samples, one of each kind in turn (in the order the OpInfo
    yields them): a cap on samples should not keep only the first kind (``x << y`` with tensors
    before ``x << 2``)."""
    by_kind: dict[tuple, list[int]] = {}
    for index, sample in enumerate(samples):
        by_kind.setdefault(kind(sample), []).append(index)
    rounds = itertools.zip_longest(*by_kind.values())
    chosen = [i for group in rounds for i in group if i is not None]
    return sorted(chosen[:limit])


def with_number_rhs(op: Any, samples: Sequence[Any], dtype: torch.dtype) -> Any | None:
    """For a binary op that takes a Python number on the right (``x << 2``, ``x * 1.1``; OpInfo
    samples seldom do), the first tensor-tensor sample with a number in place of its right
    operand; None where there is no such op or sample."""
    from torch.testing._internal.opinfo.core import SampleInput

    if not getattr(op, "supports_rhs_python_scalar", False):
        return None
    number = 1.1 if dtype.is_floating_point else 3  # 1.1: inexact in every float dtype
    for sample in samples:
        rhs = sample.args[0] if len(sample.args) == 1 else None
        if isinstance(rhs, torch.Tensor) and isinstance(sample.input, torch.Tensor):
            if sample.input.dim() and sample.input.numel() and not sample.input.is_complex():
                return SampleInput(sample.input, args=(number,), kwargs=sample.kwargs)
    return None


def clone_like(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same strides where the layout allows (``clone`` makes non-dense views
    contiguous, and the samples' strides are part of what is tested)."""
    tensor = tensor.detach()
    if tensor.layout != torch.strided or torch._debug_has_internal_overlap(tensor) != 0:
        return tensor.clone()  # sparse, or expanded: strides cannot be copied
    copy = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype)
    return copy.copy_(tensor)


def clone_tree(value: Any) -> Any:
    return pytree.tree_map(lambda v: clone_like(v) if isinstance(v, torch.Tensor) else v, value)


def perturbed(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """New values of the same kind: floats scaled by 0.9-1.1 each, other values permuted
    (an index tensor keeps its multiset of values, so it stays in range)."""
    copy = clone_like(tensor)
    if copy.layout != torch.strided:
        return copy
    if copy.is_floating_point() or copy.is_complex():
        scale = torch.rand(copy.shape, generator=generator) * 0.2 + 0.9
        return copy.mul_(scale.to(copy.dtype) if copy.is_floating_point() else scale)
    if copy.numel() < 2:
        return copy
    values = tensor.detach().reshape(-1)
    order = torch.randperm(values.numel(), generator=generator)
    return copy.copy_(values[order].reshape(tensor.shape))


def fresh(sample: Any, seed: int) -> Any:
    """``sample`` with every tensor's values renewed (OpInfo generators often seed themselves,
    so regenerating under another seed may give the same values)."""
    from torch.testing._internal.opinfo.core import SampleInput

    generator = torch.Generator().manual_seed(seed)
    args, kwargs = pytree.tree_map(
        lambda v: perturbed(v, generator) if isinstance(v, torch.Tensor) else v,
        call_parts(sample),
    )
    return SampleInput(args[0], args=tuple(args[1:]), kwargs=kwargs)


def fresh_calls(
    op: Any, dtype: torch.dtype, limit: int, pool: int = SAMPLE_POOL
) -> list[list[Any]]:
    """Per chosen sample, the samples of its three calls: the OpInfo's, then the same sample
    regenerated under other seeds (or, where that changes its structure, itself) with every
    tensor's values renewed."""
    rounds = [generate_samples(op, dtype, seed, max(pool, limit)) for seed in SEEDS]
    indices = spread(rounds[0], limit)
    if with_number_rhs(op, rounds[0], dtype) is not None:
        rounds = [[*r, with_number_rhs(op, r, dtype)] for r in rounds]
        indices.append(len(rounds[0]) - 1)
    calls = []
    for index in indices:
        first = rounds[0][index]
        later = []
        for seed, samples in zip(SEEDS[1:], rounds[1:], strict=True):
            again = samples[index] if index < len(samples) else None
            same = again is not None and structure(again) == structure(first)
            later.append(fresh(again if same else first, seed))
        calls.append([first, *later])
    return calls


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:REASON_CHARS]


def innermost(error: BaseException) -> BaseException:
    """The exception a backend raised, out of Dynamo's ``BackendCompilerFailed`` wrapping."""
    inner = getattr(error, "inner_exception", None)
    return inner if isinstance(inner, BaseException) else error


def compare(expected: Any, actual: Any, *, values: bool = True, exact: bool = False) -> str | None:
    """None when ``actual`` matches ``expected``: the same tree, tensors and numbers within
    ``assert_close``'s dtype defaults (NaN equal), other leaves (strings, dtypes) equal. Without
    ``values``, tensors need only the same shape, dtype and strides; with ``exact``, the same bits
    (NaN equal)."""
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    if expected_spec != actual_spec:
        return f"structure differs: {actual_spec} != {expected_spec}"[:REASON_CHARS]
    for index, (want, got) in enumerate(zip(expected_leaves, actual_leaves, strict=True)):
        if not values and isinstance(want, torch.Tensor):
            layout = (want.shape, want.dtype, want.stride())
            if not isinstance(got, torch.Tensor) or (got.shape, got.dtype, got.stride()) != layout:
                return f"leaf {index}: layout differs from {layout}"[:REASON_CHARS]
        elif isinstance(want, (torch.Tensor, int, float, complex)):
            try:
                tolerances = {"rtol": 0, "atol": 0} if exact else {}
                torch.testing.assert_close(got, want, equal_nan=True, **tolerances)
            except (AssertionError, TypeError, ValueError, RuntimeError) as error:
                return f"leaf {index}: {first_line(error)}"
        elif got != want:
            return f"leaf {index}: {got!r} != {want!r}"[:REASON_CHARS]
    return None


class Reasons(logging.Handler):
    """Keeps what ``npugraph_ex`` logs about running eagerly (the logged reason of a fallback)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def logged_reasons() -> Iterator[Reasons]:
    handler = Reasons()
    logger = logging.getLogger("npugraph_ex")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def make_runners(
    fn: Callable[..., Any], dynamic: bool, options: dict[str, Any] | None = None
) -> tuple[Callable, Callable]:
    """``aot_eager`` and ``npugraph_ex`` (with ``options``) compilations of ``fn``, on distinct
    code objects so that neither backend's cache entries or recompile counts touch the other's."""

    def reference(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def compiled(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return (
        torch.compile(reference, backend="aot_eager", dynamic=dynamic),
        torch.compile(compiled, backend="npugraph_ex", dynamic=dynamic, options=options or None),
    )


def fresh_dynamo() -> None:
    torch._dynamo.reset()
    npugraph_ex.reset_stats()


def run_call(runner: Callable, sample: Any) -> tuple[Any, Any]:
    """The output and the (possibly written) inputs of one call on clones of ``sample``."""
    args, kwargs = clone_tree(call_parts(sample))
    torch.manual_seed(RNG_SEED)
    output = runner(*args, **kwargs)
    # An npugraph_ex output is graph memory that the next call overwrites: keep a copy.
    return clone_tree(output), (args, kwargs)


ON_KERNELS = ("compiled", "cache_hit", "reused")
"""The ``static_kernels`` outcomes of a key that runs compiled kernels."""


def backend_counts() -> tuple[int, int, int, int, Counter]:
    """Graphs called since ``fresh_dynamo`` (earlier ones live on until garbage collected, with
    zeroed counters), and what they did: captures, replays, keys on kernels, and the calls that
    ran eagerly or keys whose static kernels failed to compile (both degrades, counted by
    reason)."""
    graphs = [
        g
        for g in npugraph_ex.stats()["graphs"]
        if g["captures"] or g["replays"] or g["eager_calls"]
    ]
    eager: Counter = Counter()
    kernels = 0
    for graph in graphs:
        kernels += sum(graph.get("static_kernels", {}).get(o, 0) for o in ON_KERNELS)
        eager.update(graph["eager_calls"])
        failed_kernels = graph.get("static_kernels", {}).get("failed", 0)
        if failed_kernels:
            eager["static kernels failed"] += failed_kernels
    return (
        len(graphs),
        sum(g["captures"] for g in graphs),
        sum(g["replays"] for g in graphs),
        kernels,
        eager,
    )


def reference_is_nondeterministic(reference: Callable, sample: Any) -> bool:
    first, _ = run_call(reference, sample)
    second, _ = run_call(reference, sample)
    return compare(first, second) is not None


def run_sample(
    fn: Callable[..., Any],
    calls: list[Any],
    dynamic: bool,
    *,
    values: bool = True,
    options: dict[str, Any] | None = None,
) -> SampleResult:
    """Three calls of one sample through both backends (fresh compilations of each); without
    ``values``, outputs are compared by layout only (see ``compare``)."""
    fresh_dynamo()
    reference, compiled = make_runners(fn, dynamic, options)
    stale, inexact = False, ""
    with logged_reasons() as reasons:
        for number, sample in enumerate(calls, start=1):
            try:
                expected = run_call(reference, sample)
            except Exception as error:  # the reference's failure is the result
                if number == 1:
                    return SampleResult(REFERENCE_FAILS, first_line(innermost(error)))
                # Renewed values broke a precondition (sorted offsets, a definite matrix).
                sample, stale = calls[0], True
                expected = run_call(reference, sample)
            try:
                actual = run_call(compiled, sample)
            except Exception as error:  # any failure of ours is the result
                return SampleResult(ERROR, f"call {number}: {first_line(innermost(error))}")
            difference = compare(expected, actual, values=values)
            if difference is not None:
                if reference_is_nondeterministic(reference, sample):
                    return SampleResult(SKIPPED, "reference output is nondeterministic")
                as_inductor = on_kernels(options) and (
                    compare(inductor_call(fn, dynamic, sample), actual) is None
                )
                cls = AS_INDUCTOR if as_inductor else MISMATCH
                return SampleResult(cls, f"call {number}: {difference}")
            if not inexact and values:
                bits = compare(expected, actual, exact=True)
                inexact = f"call {number}: {bits}" if bits else ""
    graphs, captures, replays, kernels, eager = backend_counts()
    result = SampleResult(
        EQUAL, graphs=graphs, captures=captures, replays=replays, kernels=kernels, stale=stale
    )
    result.inexact = inexact
    if not graphs:
        result.cls = NO_GRAPH
    if eager:
        result.cls = FALLBACK
        refusals = [m for m in reasons.messages if "eagerly" in m or "capture" in m]
        logged = refusals[0] if refusals else "no reason logged"
        counted = ", ".join(f"{k} x{v}" for k, v in sorted(eager.items()))
        result.reason = f"{counted}: {logged}"[:REASON_CHARS]
    return result


def on_kernels(options: dict[str, Any] | None) -> bool:
    return bool(options) and options.get("static_kernel_compile") is True


def inductor_call(fn: Callable[..., Any], dynamic: bool, sample: Any) -> tuple[Any, Any]:
    """``run_call`` of ``fn`` on ``sample`` through plain Inductor, on a code object of its
    own."""

    def plain(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return run_call(torch.compile(plain, backend="inductor", dynamic=dynamic), sample)


class OpTimeout(BaseException):
    pass


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise ``OpTimeout`` in the main thread after ``seconds`` (0: no limit)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise OpTimeout(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def summarise(
    name: str, dtype: torch.dtype, dynamic: bool, results: list[SampleResult]
) -> OpResult:
    counts = Counter(r.cls for r in results)
    cls = next((c for c in CLASSES if counts[c]), SKIPPED)
    reason = next((r.reason for r in results if r.cls == cls), "")
    if not results:
        reason = "no samples"
    return OpResult(
        name=name,
        dtype=str(dtype).removeprefix("torch."),
        dynamic=dynamic,
        cls=cls,
        reason=reason,
        samples=dict(counts),
        graphs=sum(r.graphs for r in results),
        captures=sum(r.captures for r in results),
        replays=sum(r.replays for r in results),
        kernels=sum(r.kernels for r in results),
        stale=sum(r.stale for r in results),
        inexact=next((r.inexact for r in results if r.inexact), ""),
    )


def run_target(
    target: Target,
    dtype: torch.dtype,
    *,
    dynamic: bool = False,
    limit: int = 4,
    pool: int = SAMPLE_POOL,
    timeout: int = 0,
    options: dict[str, Any] | None = None,
) -> OpResult:
    """Classify one OpInfo variant at ``dtype`` over up to ``limit`` of its first ``pool``
    samples, compiled with ``options``."""
    started = time.perf_counter()
    results: list[SampleResult] = []
    try:
        with time_limit(timeout), torch.no_grad():
            for calls in fresh_calls(target.op, dtype, limit, pool):
                results.append(
                    run_sample(target.fn, calls, dynamic, values=target.has_values, options=options)
                )
    except OpTimeout as error:
        results.append(SampleResult(TIMEOUT, f"{len(results)} samples done, then {error}"))
    except Exception as error:  # the samples themselves could not be made
        if not results:
            results.append(SampleResult(SKIPPED, f"samples: {first_line(error)}"))
    finally:
        fresh_dynamo()
    outcome = summarise(target.name, dtype, dynamic, results)
    outcome.seconds = round(time.perf_counter() - started, 2)
    return outcome


def dynamo_limits() -> Any:
    """Every sample recompiles: a context in which Dynamo does not give up on the code objects."""
    return torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=1 << 16)


def quiet_process() -> None:
    """For a sweep process: Dynamo's and torch's warnings off, npugraph_ex's kept for ``Reasons``
    only."""
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    logging.getLogger("npugraph_ex").propagate = False
    warnings.filterwarnings("ignore")


# ---------------------------------------------------------------- the whole-database driver


def worker(args: argparse.Namespace) -> None:
    """Sweep the named ops in this process, one JSON line per op (a ``start`` line first)."""
    quiet_process()
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    wanted = set(args.worker_ops.split(","))
    targets = [t for t in select_targets((), dtype, VARIANTS) if t.name in wanted]
    with open(args.results, "a") as out, dynamo_limits():
        for target in targets:
            print(json.dumps({"start": target.name}), file=out, flush=True)
            result = run_target(
                target,
                dtype,
                dynamic=args.dynamic,
                limit=args.limit_samples,
                timeout=args.timeout,
                options=parse_options(args.options),
            )
            print(json.dumps(asdict(result)), file=out, flush=True)


def read_results(path: str) -> tuple[list[dict[str, Any]], str | None]:
    """Finished results, and the op started but not finished (the one a crash interrupted)."""
    finished, started = [], None
    with open(path) as lines:
        for line in lines:
            record = json.loads(line)
            if "start" in record:
                started = record["start"]
            else:
                finished.append(record)
                started = None
    return finished, started


def sweep(args: argparse.Namespace, names: list[str]) -> list[dict[str, Any]]:
    """Run ``names`` in child processes; an op that kills its child is an error, and the sweep
    goes on after it."""
    results_path = f"{args.out_json or 'sweep'}.{args.dtype}.{int(args.dynamic)}.{os.getpid()}"
    results_path += ".jsonl.partial"
    open(results_path, "w").close()
    remaining = list(names)
    while remaining:
        command = [sys.executable, __file__, "--worker-ops", ",".join(remaining), "--results"]
        command += [results_path, *passthrough(args)]
        status = subprocess.run(command, check=False).returncode
        finished, crashed = read_results(results_path)
        done = {r["name"] for r in finished}
        if crashed is not None:
            record = OpResult(crashed, args.dtype, args.dynamic, ERROR, f"process died ({status})")
            with open(results_path, "a") as out:
                print(json.dumps(asdict(record)), file=out, flush=True)
            done.add(crashed)
        elif status != 0:
            raise SystemExit(f"sweep worker exited with {status} outside any op")
        remaining = [n for n in remaining if n not in done]
    finished, _ = read_results(results_path)
    os.unlink(results_path)
    return finished


def passthrough(args: argparse.Namespace) -> list[str]:
    flags = ["--dtype", args.dtype, "--limit-samples", str(args.limit_samples)]
    flags += ["--timeout", str(args.timeout), "--threads", str(args.threads)]
    flags += ["--options", args.options] if args.options else []
    return flags + (["--dynamic"] if args.dynamic else [])


def parse_options(text: str) -> dict[str, Any]:
    """``--options``'s ``name=value,...`` as the backend's options (values as Python literals,
    else strings): ``static_kernel_compile=True`` sweeps the kernels every key compiles."""
    options: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        try:
            options[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[name.strip()] = value.strip()
    return options


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--dynamic", action="store_true", help="compile with dynamic=True")
    parser.add_argument(
        "--options", default="", help="backend options, name=value,... (default: none given)"
    )
    parser.add_argument("--ops", default="", help="comma-separated names or fnmatch patterns")
    parser.add_argument(
        "--variants", default=",".join(DEFAULT_VARIANTS), help=f"of {', '.join(VARIANTS)}"
    )
    parser.add_argument("--limit-samples", type=int, default=4, help="samples per op")
    parser.add_argument("--limit-ops", type=int, default=0, help="at most this many ops (0: all)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per op (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--out", help="markdown report to write (runs of other kinds kept)")
    parser.add_argument("--json", dest="out_json", help="JSON of every run (read and merged)")
    parser.add_argument(
        "--update", action="store_true", help="replace only these ops' results in --json's run"
    )
    parser.add_argument("--worker-ops", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from sweep_report import merge_runs, render, run_title, sample_counts

    from npugraph_ex.bench.environment import environment, environment_line, source_commit

    args = parse(argv)
    if args.worker_ops is not None:
        worker(args)
        return 0
    patterns = [p for p in args.ops.split(",") if p]
    variants = args.variants.split(",")
    names = [t.name for t in select_targets(patterns, DTYPES[args.dtype], variants)]
    names = list(dict.fromkeys(names))[: args.limit_ops or None]
    started = time.perf_counter()
    results = sweep(args, names)
    run = {
        "dtype": args.dtype,
        "dynamic": args.dynamic,
        "options": args.options,
        "limit_samples": args.limit_samples,
        "variants": variants,
        "ops": args.ops or "all",
        "seconds": round(time.perf_counter() - started, 1),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "sample_counts": sample_counts(results),
        "environment": environment_line(environment()),
        "commits": [(source_commit() or "unknown")[:12]],
        "results": results,
    }
    counts = Counter(r["cls"] for r in results)
    print(f"{run_title(run)}: {dict(counts)} in {run['seconds']:.0f} s")
    runs = [run]
    if args.out_json:
        runs = merge_runs(args.out_json, run, update=args.update)
        with open(args.out_json, "w") as out:
            json.dump({"torch": torch.__version__, "runs": runs}, out, indent=1)
    if args.out:
        with open(args.out, "w") as out:
            out.write(render(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
