"""Helpers shared by tests: counters of the graphs a test called, and device-aware equality."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

import npugraph_ex

ANY_SPEED = 1e-9
"""A ``background_min_gain`` that keeps kernels at any speed, for tests of what happens around
the trial: a trial under the suite's other load has timed Inductor's kernels 140 times slower
than the ATen replay (their threads wait on cores that other processes hold)."""


def totals() -> dict[str, int]:
    return npugraph_ex.stats()["totals"]


def graphs_called() -> list[dict[str, Any]]:
    """Summaries of the graphs called since the last ``reset_stats()``."""
    return [
        graph
        for graph in npugraph_ex.stats()["graphs"]
        if graph["captures"] or graph["replays"] or graph["eager_calls"]
    ]


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """``torch.set_num_threads(count)`` inside the block (patterns may depend on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class GraphRecorder:
    """A ``post_grad_custom_pre_pass`` / ``post_grad_custom_post_pass`` that keeps every graph it
    is given (the graph itself: later passes go on changing it), but for the second lowering the
    kernel tier makes for Inductor (its config says ``"background"``; the replay's says False):
    the graphs kept are those the ATen replay runs."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        if config.static_kernel_compile != "background":
            self.graphs.append(gm)

    def only(self) -> torch.fx.Graph:
        (gm,) = self.graphs
        return gm.graph


def aten_graph(entry: Any) -> Any:
    """The ATen replay's graph of a captured key: the key's graph, or on the kernel tier (the
    CPU default) the ATen form it starts on."""
    return getattr(entry.graph, "aten", entry.graph)


def kernels_per_replay() -> int:
    """Kernels per replay of the one captured key of the one graph called since the last
    ``reset_stats()``."""
    (graph,) = graphs_called()
    (key,) = graph["keys"].values()
    return key["kernels"]


def assert_same(actual: torch.Tensor, expected: torch.Tensor, device: str) -> None:
    """Bit-identical on CPU (the contract there); within float tolerance on other devices."""
    if device == "cpu":
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual, expected)


def assert_trees_equal(actual: Any, expected: Any) -> None:
    """Every tensor of two output structures bit-identical, in order."""
    leaves = torch.utils._pytree.tree_leaves
    for a, b in zip(leaves(actual), leaves(expected), strict=True):
        assert torch.equal(a, b)


THREADS_SEEN: list[int] = []
"""The intra-op thread count at each real run of ``threads_seen`` (scope tests clear it)."""


@torch.library.custom_op("npugraph_ex_test::threads_seen", mutates_args=())
def threads_seen(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` that records the thread count it ran with: what a scope's kernels see."""
    THREADS_SEEN.append(torch.get_num_threads())
    return x.clone()


@threads_seen.register_fake
def threads_seen_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def counts() -> Counter[str]:
    """Totals over every live graph; eager calls and recaptures also by reason, as
    ``eager:<reason>`` and ``recapture:<reason>``."""
    report = npugraph_ex.stats()
    totals = report["totals"]
    result = Counter({key: totals[key] for key in ("captures", "replays", "recaptures")})
    result["eager_calls"] = totals["eager_calls"]
    for graph in report["graphs"]:
        result.update({f"eager:{reason}": n for reason, n in graph["eager_calls"].items()})
        result.update({f"recapture:{reason}": n for reason, n in graph["recaptures"].items()})
    return +result


def captured_on_cpu(fn: Any, *args: torch.Tensor, pool: Any = None, disabled: Any = ()) -> Any:
    """``fn`` traced to an ATen graph (``make_fx``) and captured by the CPU replay engine, with
    the build steps ``disabled`` skipped: the ``Capture`` (graph and the capturing call's
    outputs)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from npugraph_ex.runtime import runtime_for
    from npugraph_ex.runtime.base import Program

    gm = make_fx(fn)(*args)
    program = Program(gm, disabled_steps=frozenset(disabled))
    return runtime_for("cpu").capture(program, list(args), pool)


def capture_on_cpu(fn: Any, *args: torch.Tensor, pool: Any = None, disabled: Any = ()) -> Any:
    """The graph ``captured_on_cpu`` captured."""
    return captured_on_cpu(fn, *args, pool=pool, disabled=disabled).graph


@torch.library.custom_op("npugraph_ex_test::nap", mutates_args=())
def nap(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """A copy of ``x`` after sleeping (the thread lets the others run meanwhile)."""
    time.sleep(seconds)
    return x.clone()


@nap.register_fake
def nap_fake(x: torch.Tensor, seconds: float) -> torch.Tensor:
    return torch.empty_like(x)
