"""Inductor under its ``async+subprocess`` FX compile mode: the peer of
``static_kernel_compile="background"``.

With ``TORCHINDUCTOR_FX_COMPILE_MODE=async+subprocess`` Inductor compiles every graph twice: in the
serving process, as plain Inductor does (the first call waits for it), and in a subprocess, whose
result replaces the first at the graph's next call after it lands:

    first call: Inductor compile in-process -> graph sent to a subprocess
    later calls: in-process code ... subprocess result lands -> swapped in at the next call

Inductor reads the variable once, at import, into ``torch._inductor.compile_fx`` attributes that
every compile reads (``fx_compile_mode``, ``fx_compile_async``). The variant's backend sets them
for its own compiles only (``async_subprocess_inductor``), first and recompiles alike, so the other
variants in the process compile as they always do, and no call pays for the switch.

Inductor keeps a graph it cannot serialize (an op outside ``torch.ops.aten``, such as the
``prims.iota`` that ``torch.arange`` becomes) in-process only, with a logged warning: the mode then
is plain Inductor. The bench counts those graphs and their reasons (``REFUSED``), and a variant
that sent no graph to a subprocess fails with the reason instead of passing for the mode.

Inductor's FX graph cache and AOTAutograd's cache are off for these compiles: an async result
cannot be saved (``set_triton_bundle`` raises on a cache miss), and a hit, say on the graph plain
``inductor`` compiled a moment before, skips the subprocess compile altogether. PyTorch's own tests
of the mode turn both off the same way (``compile_fx_async.BUG_CACHES_DONT_WORK_WITH_ASYNC``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from npugraph_ex.errors import first_line

MODE = "async+subprocess"
"""The ``TORCHINDUCTOR_FX_COMPILE_MODE`` value this variant's compiles run under."""

REFUSED: list[str] = []
"""Why Inductor kept a graph of these compiles in-process, one entry per graph, oldest first."""

REFUSING_LOGGERS = ("torch._inductor.compile_fx", "torch._inductor.compile_fx_ext")
"""Where Inductor's serializer may log that it cannot send a graph: ``compile_fx_ext`` logs through
``compile_fx``'s logger in torch 2.13; its own is watched too, should a release give it one."""


class RefusalLog(logging.Filter):
    """Takes Inductor's warning that it cannot serialize a graph for the subprocess: keeps its
    reason in ``REFUSED`` and drops the record (a traceback on stderr), as the bench reports it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Unable to pickle"):
            return True
        error = record.exc_info[1] if record.exc_info else None
        REFUSED.append(first_line(error) if error is not None else record.getMessage())
        return False


def unsupported_reason() -> str | None:
    """Why this torch cannot run the mode and count its swaps, or None where it can."""
    import torch._inductor.compile_fx as compile_fx

    modes = getattr(compile_fx, "FxCompileMode", None)
    if modes is None or "SUBPROCESS" not in modes.__members__:
        return f"torch {torch.__version__} has no FxCompileMode.SUBPROCESS"
    if not hasattr(compile_fx, "fx_compile_async"):
        return f"torch {torch.__version__} has no torch._inductor.compile_fx.fx_compile_async"
    try:
        from torch._inductor.compile_fx_async import _AsyncFxCompile
    except ImportError as error:
        return f"torch {torch.__version__} has no async FX compile ({error})"
    if not all(
        hasattr(_AsyncFxCompile, stat) for stat in ("_stat_bg_started", "_stat_bg_finished")
    ):
        return f"torch {torch.__version__} does not count its async compiles"
    return None


@contextlib.contextmanager
def async_subprocess_compiles() -> Iterator[None]:
    """Inductor compiles made inside run under ``async+subprocess``, with its caches off and its
    refusals to serialize a graph taken by ``RefusalLog``."""
    import torch._functorch.config
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config

    modes = {
        "fx_compile_mode": compile_fx.FxCompileMode.SUBPROCESS,
        "fx_compile_async": True,
        "fx_compile_progressive": False,
    }
    saved = {name: getattr(compile_fx, name) for name in modes if hasattr(compile_fx, name)}
    refusals = RefusalLog()
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
        stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
        for name in REFUSING_LOGGERS:
            logger = logging.getLogger(name)
            logger.addFilter(refusals)
            stack.callback(logger.removeFilter, refusals)
        for name, value in saved.items():
            stack.callback(setattr, compile_fx, name, value)
            setattr(compile_fx, name, modes[name])
        yield


def async_subprocess_inductor(
    gm: torch.fx.GraphModule, example_inputs: list[Any]
) -> Callable[..., Any]:
    """A ``torch.compile`` backend: ``backend="inductor"`` with each compile under the mode.

    Dynamo calls it at the first call and at every recompile, in the calling thread, and the
    in-process compile and the hand-over to the subprocess both happen inside it.
    """
    from torch._inductor.compile_fx import compile_fx

    with async_subprocess_compiles():
        return compile_fx(gm, example_inputs)


def compiled(fn: Callable[..., Any], args: Mapping[str, Any]) -> Callable[..., Any]:
    """``fn`` compiled with ``args`` (``backend="inductor"``, ``fx_compile_mode=MODE``) through
    ``async_subprocess_inductor``; raises ``NotImplementedError`` on a torch without the mode."""
    reason = unsupported_reason()
    if reason is not None:
        raise NotImplementedError(f"{MODE} compiles cannot run: {reason}")
    kept = {k: v for k, v in args.items() if k not in ("backend", "fx_compile_mode")}
    return torch.compile(fn, backend=async_subprocess_inductor, **kept)


def swap_counts() -> tuple[int, int]:
    """Graphs sent to a subprocess and graphs swapped in since the process started.

    Inductor counts both process-wide; a graph counts as swapped at the call that finds its
    subprocess result done and takes it, not when the result lands.
    """
    from torch._inductor.compile_fx_async import _AsyncFxCompile

    return _AsyncFxCompile._stat_bg_started, _AsyncFxCompile._stat_bg_finished


class Swaps:
    """The graphs compiled under the mode since this was made, by state: ``pending`` (compiling
    in the subprocess, or done there but not yet taken by a call), ``swapped``, and
    ``in-process`` (Inductor could not serialize it: ``REFUSED``). Made before the variant's
    first call; no other variant compiles under the mode, so the counts are the variant's."""

    what = "graph"

    def __init__(self) -> None:
        self.started, self.swapped = swap_counts()
        self.refused = len(REFUSED)

    def __call__(self) -> dict[str, int]:
        started, swapped = swap_counts()
        started, swapped = started - self.started, swapped - self.swapped
        states = {
            "swapped": swapped,
            "pending": started - swapped,
            "in-process": len(REFUSED) - self.refused,
        }
        return {state: count for state, count in states.items() if count}

    def problem(self) -> str | None:
        """Why the variant's figures are not the mode's: no graph went to a subprocess."""
        if swap_counts()[0] > self.started:
            return None
        reasons = REFUSED[self.refused :]
        why = (
            f"Inductor could not serialize it ({reasons[0]})"
            if reasons
            else "Inductor sent none (it keeps a graph it cannot serialize in-process)"
        )
        return (
            f"no graph was compiled in a subprocess: {why}; it ran as plain in-process Inductor "
            "(with its caches off)"
        )
