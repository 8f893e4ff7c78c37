"""``npugraph_ex.tools.bisect``: which layer of the stack changes a function's result, and where.

The accuracy workflow of a wrong number, run by the machine. Each trial calls ``fn`` on fresh
copies of the arguments (after ``torch._dynamo.reset()``) and compares its outputs with eager's:

1. ``aot_eager``: Dynamo and AOTAutograd alone. A difference here is theirs (or the model's:
   code whose result depends on how it is traced).
2. npugraph_ex with ``force_eager`` and every pass off: the graph as AOTAutograd made it, run by
   npugraph_ex.
3. npugraph_ex with ``force_eager``: the passes. On a difference, each pass is turned off in turn;
   the first whose absence restores the result is named, and dumps of the graph before the passes
   and after them name the first node that differs and its source line.
4. npugraph_ex as configured, called twice (a capture, then a replay): capture and replay.
   Dumps of the graph run node by node and of its replay name the first node that differs.
5. With ``static_kernel_compile=True``: the static kernels.

The first trial that differs ends the search. Compared with PyTorch's accuracy minifier, which
shrinks a failing graph by re-running it many times, this names the layer, the pass and the node
in a handful of runs.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.config import Config
from npugraph_ex.debug.dump_files import DumpError, dump_folders, read_dump
from npugraph_ex.passes.manager import PassManager
from npugraph_ex.passes.pipeline import PIPELINE
from npugraph_ex.tools.compare import compare_dumps, errors


@dataclass
class Trial:
    """One run of the function, and how far its outputs are from eager's."""

    name: str
    max_abs: float | None
    """Largest absolute difference from eager over every tensor output; None when it failed."""
    ok: bool
    note: str = ""


@dataclass
class Divergence:
    """The first node whose outputs differ between two dumps of one graph."""

    graph: str
    name: str
    origin: str
    op: str
    source: str
    max_abs: float
    text: str
    """The comparer's report."""


@dataclass
class BisectResult:
    layer: str | None
    """``"Dynamo/AOTAutograd"``, ``"npugraph_ex without passes"``, ``"pass <name>"``,
    ``"passes"`` (no single pass alone), ``"capture/replay"``, ``"static kernels"``, or None
    when every trial matches eager."""
    trials: list[Trial] = field(default_factory=list)
    node: Divergence | None = None

    def report(self) -> str:
        lines = [f"{'trial':<50} max abs diff   result"]
        for trial in self.trials:
            diff = "failed" if trial.max_abs is None else f"{trial.max_abs:.3g}"
            verdict = "ok" if trial.ok else "DIFFERS"
            note = f"  ({trial.note})" if trial.note else ""
            lines.append(f"{trial.name:<50} {diff:>12}   {verdict}{note}")
        if self.layer is None:
            lines.append("every layer matches eager")
            return "\n".join(lines)
        lines.append(f"first layer that changes the result: {self.layer}")
        if self.node is not None:
            node = self.node
            lines.append(
                f"first node that differs: {node.name} ({node.op}) in {node.graph} at "
                f"{node.source}, max abs diff {node.max_abs:.3g}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


class Runner:
    """Calls the function under test, compiled or not, on fresh copies of its arguments."""

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict, rtol: float, atol: float):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.rtol, self.atol = rtol, atol
        self.reference: list[Any] = []

    def call(self, fn: Callable[..., Any]) -> list[Any]:
        args, kwargs = copy.deepcopy((self.args, self.kwargs))
        with torch.no_grad():
            result = fn(*args, **kwargs)
        leaves = torch.utils._pytree.tree_leaves(result)
        return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in leaves]

    def compiled(self, backend: str, options: dict[str, Any] | None, calls: int) -> list[list[Any]]:
        torch._dynamo.reset()
        extra = {"options": options} if backend == "npugraph_ex" else {}
        compiled = torch.compile(self.fn, backend=backend, **extra)
        return [self.call(compiled) for _ in range(calls)]

    def distance(self, outputs: list[Any]) -> tuple[float, bool]:
        """Largest absolute difference from the reference, and whether every output is close."""
        if len(outputs) != len(self.reference):
            return float("inf"), False
        worst, close = 0.0, True
        for got, want in zip(outputs, self.reference, strict=True):
            if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
                close &= got == want
                continue
            if got.shape != want.shape or got.dtype != want.dtype:
                return float("inf"), False
            if got.numel():
                abs_error, _, within, _ = errors(got, want, self.rtol, self.atol)
                worst, close = max(worst, abs_error), close and within
        return worst, bool(close)


class Bisection:
    def __init__(self, runner: Runner, options: dict[str, Any], dump_root: Path):
        self.runner = runner
        self.options = options
        self.dump_root = dump_root
        self.trials: list[Trial] = []

    def trial(
        self, name: str, backend: str, options: dict[str, Any] | None, calls: int = 1
    ) -> bool:
        try:
            runs = self.runner.compiled(backend, options, calls)
        except Exception as error:  # a trial that fails is a difference, reported as such
            self.trials.append(Trial(name, None, False, f"{type(error).__name__}: {error}"[:200]))
            return False
        results = [self.runner.distance(outputs) for outputs in runs]
        worst = max(diff for diff, _ in results)
        ok = all(close for _, close in results)
        self.trials.append(Trial(name, worst, ok))
        return ok

    def with_options(self, **changes: Any) -> dict[str, Any]:
        return {**self.options, **changes}

    def first_node(self, before: dict[str, Any], after: dict[str, Any], calls: int) -> Any:
        """Dump the graph under ``before`` and ``after`` options (the last of ``calls`` calls)
        and compare: the first node that differs, or None."""
        roots = []
        for label, options in (("a", before), ("b", after)):
            root = self.dump_root / f"{len(self.trials):02d}{label}"
            root.mkdir(parents=True)
            dump = {"dump_tensor_data": True, "data_dump_dir": str(root)}
            dump["data_dump_calls"] = str(calls - 1)
            self.runner.compiled("npugraph_ex", {**options, **dump}, calls)
            roots.append(root)
        pairs = zip(dump_folders(roots[0]), dump_folders(roots[1]), strict=False)
        for folder_a, folder_b in pairs:
            try:
                comparison = compare_dumps(
                    read_dump(folder_a), read_dump(folder_b), rtol=self.runner.rtol,
                    atol=self.runner.atol,
                )  # fmt: skip
            except DumpError:
                continue
            row = comparison.first_divergence
            if row is not None:
                return Divergence(
                    comparison.b.graph, row.name_b, row.origin, row.op_b, row.source,
                    row.max_abs, comparison.report(),
                )  # fmt: skip
        return None


def bisect(
    fn: Callable[..., Any],
    *args: Any,
    options: dict[str, Any] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    static_kernels: bool = True,
    dump_dir: str | Path | None = None,
    **kwargs: Any,
) -> BisectResult:
    """Find the first layer (and, with dumps, the first node) that changes ``fn(*args,
    **kwargs)`` from eager. See the module docstring for the trials. ``options`` are the
    npugraph_ex options to bisect; outputs are compared with ``torch.allclose(rtol, atol)``;
    ``dump_dir`` keeps the dumps (default: a temporary folder).

    ``fn`` runs many times under ``torch.no_grad()``, on fresh copies of the arguments; module
    state it writes (a buffer, a cache) is not reset between trials, so pass such state in the
    arguments. Resets Dynamo (``torch._dynamo.reset()``) before each trial.
    """
    # The layers up to the capture are the ATen replay's (the CPU default's tier swaps kernels
    # in only after many calls); compiled kernels are the last trial, asked for by name.
    options = {"static_kernel_compile": False, **(options or {})}
    Config.from_options(options)  # a bad option fails here, before any trial
    runner = Runner(fn, args, kwargs, rtol, atol)
    runner.reference = runner.call(fn)
    with tempfile.TemporaryDirectory(prefix="npugraph_ex_bisect_") as scratch:
        root = Path(dump_dir) if dump_dir is not None else Path(scratch)
        return run_trials(Bisection(runner, options, root), static_kernels)


def run_trials(b: Bisection, static_kernels: bool) -> BisectResult:
    passes = [p.name for p in PassManager(PIPELINE, Config.from_options(b.options)).selected()]
    eager = b.with_options(force_eager=True)
    if not b.trial("aot_eager (Dynamo + AOTAutograd)", "aot_eager", None):
        return BisectResult("Dynamo/AOTAutograd", b.trials)
    no_passes = b.with_options(force_eager=True, disabled_passes=passes)
    if not b.trial("npugraph_ex, force_eager, every pass off", "npugraph_ex", no_passes):
        return BisectResult("npugraph_ex without passes", b.trials)
    if not b.trial("npugraph_ex, force_eager", "npugraph_ex", eager):
        layer = "passes"
        for name in passes:
            off = b.with_options(force_eager=True, disabled_passes=[name])
            if b.trial(f"npugraph_ex, force_eager, {name} off", "npugraph_ex", off):
                layer = f"pass {name}"
                break
        before = b.with_options(force_eager=True, data_dump_stage="original")
        return BisectResult(layer, b.trials, b.first_node(before, eager, 1))
    if not b.trial("npugraph_ex (capture, then replay)", "npugraph_ex", b.options, calls=2):
        return BisectResult("capture/replay", b.trials, b.first_node(eager, b.options, 2))
    kernels = b.with_options(static_kernel_compile=True)
    if static_kernels and not b.trial("npugraph_ex, static kernels", "npugraph_ex", kernels, 2):
        return BisectResult("static kernels", b.trials)
    return BisectResult(None, b.trials)
