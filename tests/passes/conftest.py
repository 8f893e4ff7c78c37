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


def trace(fn: Callable[..., Any], *args: Any) -> Traced:
    """Trace ``fn(*args)`` with Dynamo and AOTAutograd exactly as the backend does."""
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
        torch.compile(fn, backend=backend, fullgraph=True)(*args)
    (traced,) = found
    return traced


@pytest.fixture
def traced() -> Callable[..., Traced]:
    """``traced(fn, *args)``: the graph the passes see for ``fn(*args)``."""
    return trace
