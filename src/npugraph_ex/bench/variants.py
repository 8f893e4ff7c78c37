"""The ways a step can run: eager, npugraph_ex, and the peers it is measured against.

Each variant compiles its own copy of the step function with its own code object. Dynamo keeps
its compiled code and guards on the code object, so variants compiled from one function would
sit behind each other: every call of one would first check the guards of those compiled before
it. ``torch._dynamo.reset()`` between variants is no way out, as it drops the compiled code of
the variants still to be timed.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from npugraph_ex.bench import inductor_async


@dataclass(frozen=True)
class Variant:
    """One way to run the step: eager (no backend) or ``torch.compile`` with these arguments."""

    name: str
    backend: str | None = None
    """``torch.compile`` backend; None with no ``mode`` runs the step eagerly."""
    mode: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    captures: bool = False
    """Compiles through npugraph_ex: has capture managers whose keys and pools are reported."""
    devices: tuple[str, ...] = ("cpu", "cuda")
    cached: bool = False
    """Compiled by ``npugraph_ex.inference.cache_compile`` on an empty folder (a cold start)
    instead of ``torch.compile``."""
    settles: bool = False
    """Its code changes form while it serves (background compiles): it runs until it settles,
    timed call by call, before the timed rounds (``settling``)."""
    async_subprocess: bool = False
    """Compiled by Inductor under its ``async+subprocess`` FX compile mode, for this variant's
    compiles only (``inductor_async``)."""

    @property
    def compiled(self) -> bool:
        return self.backend is not None or self.mode is not None

    def compile_args(self, *, dynamic: bool, npugraph_options: Mapping[str, Any]) -> dict:
        """The keyword arguments of ``torch.compile`` (``fullgraph=True`` always), and
        ``cache_compile=True`` for a variant compiled through the compile cache, or
        ``fx_compile_mode`` (``TORCHINDUCTOR_FX_COMPILE_MODE``) for one compiled under it.

        ``npugraph_options`` (a workload's ``capture_limit``) go to npugraph_ex variants only.
        """
        args: dict[str, Any] = {"fullgraph": True, "dynamic": dynamic}
        if self.backend is not None:
            args["backend"] = self.backend
        if self.mode is not None:
            args["mode"] = self.mode
        options = {**npugraph_options, **self.options} if self.captures else dict(self.options)
        if options:
            args["options"] = options
        if self.cached:
            args["cache_compile"] = True  # through cache_compile (fullgraph, this backend)
        if self.async_subprocess:
            args["fx_compile_mode"] = inductor_async.MODE
        return args

    def prepare(
        self, step: Callable[..., Any], args: Mapping[str, Any] | None
    ) -> Callable[..., Any]:
        """The step as this variant runs it: ``step`` itself, or a copy compiled with ``args``.

        Compilation happens lazily, on the first call, as it does for users.
        """
        if args is None:
            return step
        if self.cached:
            return cache_compiled(step, args)
        if self.async_subprocess:
            return inductor_async.compiled(own_code(step, self.name), args)
        return torch.compile(own_code(step, self.name), **args)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("eager"),
        Variant("npugraph_ex", backend="npugraph_ex", captures=True, settles=True),
        Variant(
            "npugraph_ex+aten",
            backend="npugraph_ex",
            options={"static_kernel_compile": False},
            captures=True,
        ),
        Variant(
            "npugraph_ex+static_kernels",
            backend="npugraph_ex",
            options={"static_kernel_compile": True},
            captures=True,
        ),
        Variant(
            "npugraph_ex+background",
            backend="npugraph_ex",
            options={"static_kernel_compile": "background"},
            captures=True,
            settles=True,
        ),
        Variant(
            "npugraph_ex+cache_compile",
            backend="npugraph_ex",
            captures=True,
            cached=True,
            settles=True,
        ),
        Variant(
            "npugraph_ex+static_kernels+cache_compile",
            backend="npugraph_ex",
            options={"static_kernel_compile": True},
            captures=True,
            cached=True,
        ),
        Variant("aot_eager", backend="aot_eager"),
        Variant("inductor", backend="inductor"),
        Variant("inductor+async", backend="inductor", settles=True, async_subprocess=True),
        Variant(
            "inductor+cpp_wrapper",
            backend="inductor",
            options={"cpp_wrapper": True},
            devices=("cpu",),
        ),
        Variant("reduce-overhead", mode="reduce-overhead", devices=("cuda",)),
        Variant("cudagraphs", backend="cudagraphs", devices=("cuda",)),
    )
}
"""Every variant by name, in the order tables list them."""

BASELINE = "eager"

CACHED = tuple(name for name, variant in VARIANTS.items() if variant.cached)
"""The variants compiled through ``cache_compile``: the call as a served model makes it."""

DEFAULTS: dict[str, tuple[str, ...]] = {
    "growing": ("eager", "npugraph_ex", "npugraph_ex+aten", "npugraph_ex+cache_compile"),
    "decode": ("eager", "npugraph_ex", "npugraph_ex+aten", "npugraph_ex+static_kernels", *CACHED),
    "token": ("eager", "npugraph_ex", "npugraph_ex+aten", "npugraph_ex+static_kernels", *CACHED),
    "window": ("eager", "npugraph_ex", "npugraph_ex+aten", "npugraph_ex+static_kernels", *CACHED),
}
"""What each workload runs without ``--variants``."""

PEERS = ("aot_eager", "inductor", "inductor+cpp_wrapper", "reduce-overhead", "cudagraphs")
"""What ``--peers`` adds (those that run on the chosen device)."""


def names_for(device: str) -> list[str]:
    """Variant names that run on ``device``."""
    return [name for name, v in VARIANTS.items() if device in v.devices]


def check_names(names: Sequence[str], device: str) -> str | None:
    """Why ``names`` cannot run on ``device`` (an unknown name, or one for another device)."""
    valid = names_for(device)
    for name in names:
        if name in VARIANTS and name not in valid:
            only = ", ".join(VARIANTS[name].devices)
            return f"variant {name!r} runs on {only} only, not on {device}"
        if name not in VARIANTS:
            return f"unknown variant {name!r}; valid variants on {device}: {', '.join(valid)}"
    return None


def selection(workload: str, device: str, chosen: Sequence[str] | None, peers: bool) -> list[str]:
    """The variants a workload runs, eager first (every ratio is against it), in table order."""
    picked = set(chosen if chosen is not None else DEFAULTS[workload]) | {BASELINE}
    if peers:
        picked |= {name for name in PEERS if device in VARIANTS[name].devices}
    return [name for name in VARIANTS if name in picked]


def own_code(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """A copy of ``fn`` with its own code object (named after ``tag``), closure and globals shared.

    Dynamo attaches compiled code and guards to the code object, so the copy is compiled and
    guarded apart from ``fn`` and from every other copy.
    """
    code = fn.__code__
    suffix = "_" + re.sub(r"\W", "_", tag)
    name = code.co_name + suffix
    changes: dict[str, Any] = {"co_name": name}
    if hasattr(code, "co_qualname"):
        changes["co_qualname"] = code.co_qualname + suffix
    copy = types.FunctionType(
        code.replace(**changes), fn.__globals__, name, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


class StepModule(torch.nn.Module):
    """A step function as a module's method: what ``cache_compile`` takes."""

    def __init__(self, step: Callable[..., Any]):
        super().__init__()
        self.step = step

    def forward(self, *args: Any) -> Any:
        return self.step(*args)


def cache_compiled(step: Callable[..., Any], args: Mapping[str, Any]) -> Callable[..., Any]:
    """``step`` through ``cache_compile`` with ``args``' options, on a fresh folder removed when
    the compiled step goes."""
    import npugraph_ex.inference

    folder = tempfile.mkdtemp(prefix="npugraph_ex_bench_cache_")
    cached = npugraph_ex.inference.cache_compile(
        StepModule(step).forward,
        cache_dir=folder,
        dynamic=args["dynamic"],
        options=args.get("options", {}),
    )
    weakref.finalize(cached, shutil.rmtree, folder, ignore_errors=True)
    return cached
