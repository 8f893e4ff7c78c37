"""``custom_decompositions`` are AOTAutograd's: the op is gone from the graph the passes see,
its replacement is there, and the result is eager's, through each way of giving them."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch

from models import make_mlp
from npugraph_ex.torchair_compat import CompilerConfig, get_npu_backend

aten = torch.ops.aten


def exact_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU from erf, as eager computes it."""
    return x * 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


class OpCounter:
    """A custom pass that counts the ops of the graph it is given, before any pass runs."""

    def __init__(self) -> None:
        self.counts: list[Counter[Any]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        self.counts.append(
            Counter(node.target for node in gm.graph.nodes if node.op == "call_function")
        )


def run(backend: Any, options: dict[str, Any]) -> tuple[Counter[Any], torch.Tensor, torch.Tensor]:
    """(ops of the graph the passes were given, compiled result, eager result) of the MLP."""
    model = make_mlp()
    counter = OpCounter()
    compiled = torch.compile(
        model, backend=backend, options={**options, "post_grad_custom_pre_pass": counter}
    )
    x = torch.randn(4, 32)
    with torch.no_grad():
        compiled(x)
        got = compiled(x).clone()  # replayed
        want = model(x)
    (counts,) = counter.counts
    return counts, got, want


def test_without_decompositions_gelu_stays() -> None:
    counts, got, want = run("npugraph_ex", {})
    assert counts[aten.gelu.default] == 1
    assert counts[aten.erf.default] == 0
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("op", [aten.gelu.default, aten.gelu], ids=["overload", "packet"])
@pytest.mark.parametrize("given", ["get_npu_backend", "options"])
def test_a_decomposition_replaces_its_op(op: Any, given: str) -> None:
    decompositions = {op: exact_gelu}
    if given == "get_npu_backend":
        config = CompilerConfig()
        config.mode = "npugraph_ex"
        backend = get_npu_backend(compiler_config=config, custom_decompositions=decompositions)
        counts, got, want = run(backend, {})
    else:
        counts, got, want = run("npugraph_ex", {"custom_decompositions": decompositions})
    assert counts[aten.gelu.default] == 0
    assert counts[aten.erf.default] == 1
    torch.testing.assert_close(got, want)


def test_torch_compile_options_override_the_backend_s() -> None:
    def relu_of_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        return torch.relu(x)

    backend = get_npu_backend(custom_decompositions={aten.gelu.default: relu_of_gelu})
    counts, got, want = run(backend, {"custom_decompositions": {aten.gelu.default: exact_gelu}})
    assert (counts[aten.erf.default], counts[aten.relu.default]) == (1, 0)
    torch.testing.assert_close(got, want)
