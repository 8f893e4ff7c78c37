"""Python floats under ``dynamic=True``: the model's become guarded constants, arguments inputs.

The graph the passes see is recorded through ``post_grad_custom_pre_pass``; recompiles are
counted as npugraph_ex graphs (one capture manager per graph Dynamo hands the backend).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import npugraph_ex
from helpers import GraphRecorder, graphs_called, totals


class ScaledNorm(nn.Module):
    """An RMSNorm-like module holding its ``eps`` and ``scale`` as Python floats."""

    def __init__(self) -> None:
        super().__init__()
        self.eps = 1e-6
        self.scale = 0.125
        self.weight = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor, temperature: float) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return h * self.scale / temperature


def float_inputs(graph: torch.fx.Graph) -> list[str]:
    """Placeholders holding a 0-d float64 tensor: a Python float passed in."""
    return [
        node.name
        for node in graph.find_nodes(op="placeholder")
        if isinstance(value := node.meta.get("val"), torch.Tensor)
        and value.dim() == 0
        and value.dtype == torch.float64
    ]


def float_constants(graph: torch.fx.Graph) -> set[float]:
    return {a for node in graph.nodes for a in node.args if isinstance(a, float)}


def compile_norm(recorder: GraphRecorder | None = None) -> tuple[ScaledNorm, object]:
    torch._dynamo.reset()
    npugraph_ex.reset_stats()
    module = ScaledNorm().eval()
    options = {"post_grad_custom_pre_pass": recorder} if recorder else None
    compiled = torch.compile(module, backend="npugraph_ex", dynamic=True, options=options)
    return module, compiled


@torch.no_grad()
def test_the_model_floats_are_constants_and_the_argument_an_input() -> None:
    recorder = GraphRecorder()
    module, compiled = compile_norm(recorder)
    x = torch.randn(3, 8)
    assert torch.equal(compiled(x, 2.0), module(x, 2.0))
    assert {1e-6, 0.125} <= float_constants(recorder.only())
    assert len(float_inputs(recorder.only())) == 1  # the temperature


@torch.no_grad()
def test_a_new_argument_value_replays_the_same_capture() -> None:
    module, compiled = compile_norm()
    x = torch.randn(3, 8)
    for temperature in (0.5, 0.7, 0.9):
        assert torch.equal(compiled(x, temperature), module(x, temperature))
    assert len(graphs_called()) == 1
    assert totals()["captures"] == 1 and totals()["replays"] == 2


@torch.no_grad()
@pytest.mark.parametrize("attribute", ["eps", "scale"])
def test_changing_a_model_float_recompiles_rather_than_replaying_the_old_value(
    attribute: str,
) -> None:
    module, compiled = compile_norm()
    x = torch.randn(3, 8)
    assert torch.equal(compiled(x, 1.0), module(x, 1.0))
    setattr(module, attribute, 0.5)
    assert torch.equal(compiled(x, 1.0), module(x, 1.0))
    assert len(graphs_called()) == 2  # Dynamo's guard on the value sent it to trace again
    assert totals()["captures"] == 2 and totals()["replays"] == 0


@torch.no_grad()
def test_a_float_inside_a_dict_argument_stays_an_input() -> None:
    def fn(x: torch.Tensor, settings: dict[str, float]) -> torch.Tensor:
        return x * settings["gain"]

    torch._dynamo.reset()
    npugraph_ex.reset_stats()
    compiled = torch.compile(fn, backend="npugraph_ex", dynamic=True)
    x = torch.randn(4)
    for gain in (1.5, 2.5, 3.5):
        assert torch.equal(compiled(x, {"gain": gain}), fn(x, {"gain": gain}))
    assert len(graphs_called()) == 1
    assert totals()["captures"] == 1 and totals()["replays"] == 2


@torch.no_grad()
def test_no_specialisation_outlives_the_compile_that_asked_for_it() -> None:
    # Dynamo keys them by symbol names that other frames' floats can share (a hash of the
    # source name, modulo 100): one left behind would freeze some later function's argument.
    from torch._dynamo.symbolic_convert import TensorifyState

    module, compiled = compile_norm()
    compiled(torch.randn(3, 8), 1.0)
    assert TensorifyState.empty()


@dataclasses.dataclass
class Sampling:
    temperature: float


@torch.no_grad()
def test_a_float_attribute_of_an_argument_object_stays_an_input() -> None:
    # A sampling config passed per call is data, though it is read as an attribute.
    def fn(x: torch.Tensor, sampling: Sampling) -> torch.Tensor:
        return x / sampling.temperature

    torch._dynamo.reset()
    npugraph_ex.reset_stats()
    compiled = torch.compile(fn, backend="npugraph_ex", dynamic=True)
    x = torch.randn(4)
    for temperature in (0.6, 0.8, 1.0):
        assert torch.equal(compiled(x, Sampling(temperature)), fn(x, Sampling(temperature)))
    assert len(graphs_called()) == 1
    assert totals()["captures"] == 1 and totals()["replays"] == 2


GAIN = 2.0


@torch.no_grad()
def test_a_global_float_is_a_guarded_constant() -> None:
    global GAIN

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * GAIN

    torch._dynamo.reset()
    npugraph_ex.reset_stats()
    recorder = GraphRecorder()
    compiled = torch.compile(
        fn, backend="npugraph_ex", dynamic=True, options={"post_grad_custom_pre_pass": recorder}
    )
    x = torch.randn(4)
    assert torch.equal(compiled(x), x * 2.0)
    assert 2.0 in float_constants(recorder.graphs[0].graph)
    GAIN = 3.0
    try:
        assert torch.equal(compiled(x), x * 3.0)
    finally:
        GAIN = 2.0
    assert len(graphs_called()) == 2
