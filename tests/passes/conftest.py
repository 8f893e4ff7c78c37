"""The recording fixture for pass tests: the real Dynamo + AOTAutograd graph a pass receives."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified


@dataclass
class Traced:
    """The inference graph of one call, and the inputs it was traced with."""

    gm: torch.fx.GraphModule
    inputs: list[Any]

    def op_counts(self) -> Counter[str]:
        return Counter(str(n.target) for n in self.gm.graph.nodes if n.op == "call_function")

    def count(self, target: Any) -> int:
        return sum(1 for n in self.gm.graph.nodes if n.target is target)

    def run(self, *args: Any) -> Any:
        """The graph's outputs for ``args``, from its code as the passes left it (a pass edits
        the graph; the module runs the code generated before until it is generated again)."""
        self.gm.recompile()
        return self.gm(*args)


def trace(fn: Callable[..., Any], *args: Any, dynamic: bool | None = None) -> Traced:
    """Trace ``fn(*args)`` with Dynamo and AOTAutograd exactly as the backend does (with
    ``torch.compile``'s ``dynamic``)."""
    found: list[Traced] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        found.append(Traced(gm, list(example_inputs)))
        return gm

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=record,
            inference_compiler=record,
            keep_inference_input_mutations=True,
        )

    with torch.no_grad():
        torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    (traced,) = found
    return traced


@pytest.fixture
def traced() -> Callable[..., Traced]:
    """``traced(fn, *args)``: the graph the passes see for ``fn(*args)``."""
    return trace


@dataclass
class Fused:
    """A graph before and after ``pattern_fusion_pass`` (``remove_noop_ops`` first, as the
    pipeline runs it), and what it computes against eager."""

    before: Counter[str]
    after: Counter[str]
    actual: list[Any]
    expected: list[Any]

    def applied(self, target: Any) -> bool:
        """The pattern put ``target`` (the op it replaces with) in the graph."""
        return self.after[str(target)] > self.before[str(target)]

    def refused(self) -> bool:
        return self.after == self.before

    def assert_close(self, **tolerance: Any) -> None:
        """Outputs equal to eager's: bit-identical, or within ``tolerance``."""
        for actual, expected in zip(self.actual, self.expected, strict=True):
            assert actual.dtype == expected.dtype and actual.shape == expected.shape
            if tolerance:
                torch.testing.assert_close(actual, expected, **tolerance)
            else:
                assert torch.equal(actual, expected)


def fuse(fn: Callable[..., Any], *args: Any) -> Fused:
    """``fn(*args)`` compiled through ``remove_noop_ops`` and ``pattern_fusion_pass`` only, its
    graph counted before and after the fusion, and run (the graph itself, eagerly)."""
    from npugraph_ex.config import Config
    from npugraph_ex.passes.fuse_patterns import fuse_patterns
    from npugraph_ex.passes.patterns import canonical_spellings
    from npugraph_ex.passes.remove_noop import remove_noop_ops

    counts: list[Counter[str]] = []

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        remove_noop_ops(gm, example_inputs, Config())
        canonical_spellings(gm.graph)  # the fusion pass does it first; it fuses nothing
        counts.append(Traced(gm, example_inputs).op_counts())
        fuse_patterns(gm, example_inputs, Config())
        gm.graph.lint()
        gm.recompile()
        counts.append(Traced(gm, example_inputs).op_counts())
        return gm

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=compile_graph,
            inference_compiler=compile_graph,
            keep_inference_input_mutations=True,
        )

    with torch.no_grad():
        # AOTAutograd orders the graph's inputs as it likes: the compiled function maps them.
        actual = torch.compile(fn, backend=backend, fullgraph=True)(*args)
        expected = fn(*args)
    before, after = counts
    leaves = torch.utils._pytree.tree_leaves
    return Fused(before, after, leaves(actual), leaves(expected))


@pytest.fixture
def fused() -> Callable[..., Fused]:
    """``fused(fn, *args)``: ``fn``'s graph through ``pattern_fusion_pass``: op counts before and
    after, and its outputs next to eager's."""
    return fuse
