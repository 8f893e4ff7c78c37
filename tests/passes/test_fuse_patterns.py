"""pattern_fusion_pass and the public register_replacement."""

from __future__ import annotations

import pytest
import torch

import npugraph_ex
from helpers import kernels_per_replay
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.manager import PassManager
from npugraph_ex.passes.patterns import registry
from npugraph_ex.passes.pipeline import PIPELINE
from npugraph_ex.scope import stream

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("scratch_registry")


def sinh_plus_cosh(x: torch.Tensor) -> torch.Tensor:
    return torch.sinh(x) + torch.cosh(x)


def exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


def model(x: torch.Tensor) -> torch.Tensor:
    return sinh_plus_cosh(x * 3).relu()


def test_a_registered_user_pattern_is_applied(traced) -> None:
    assert npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)])
    graph = traced(model, torch.randn(2, 3))
    fuse_patterns(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.exp.default"] == 1
    assert "aten.sinh.default" not in counts and "aten.cosh.default" not in counts


@torch.no_grad()
def test_a_registered_pattern_changes_what_is_captured() -> None:
    npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)])
    compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True)
    x = torch.randn(5, 2)
    # exp(3x) is what sinh + cosh compute, without their cancellation error for negative x.
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert kernels_per_replay() == 3  # mul, exp, relu


def test_registering_a_pattern_twice_with_skip_duplicates_is_a_no_op() -> None:
    assert npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)])
    assert not npugraph_ex.register_replacement(
        sinh_plus_cosh, exp, [torch.randn(4)], skip_duplicates=True
    )


def test_a_failing_extra_check_keeps_the_graph(traced) -> None:
    seen = []

    def refuse(match) -> bool:
        seen.append(match)
        return False

    npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)], extra_check=refuse)
    graph = traced(model, torch.randn(2, 3))
    before = graph.op_counts()
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert seen and graph.op_counts() == before


def test_the_option_turns_the_pass_off(traced) -> None:
    npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)])
    graph = traced(model, torch.randn(2, 3))
    gm = PassManager(PIPELINE, Config(pattern_fusion_pass=False))(graph.gm, graph.inputs)
    assert sum(1 for n in gm.graph.nodes if n.target is aten.sinh.default) == 1


def double_then_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2 + y


def add_twice(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.add(x, y, alpha=1) + x


def doubled_in_scope(x, y):
    with stream("branch"):
        d = x * 2
    return (d + y).relu()


def doubled_with_scope(x, y):
    with stream("branch"):
        d = x * 2 + y
    return d.relu()


@torch.no_grad()
def test_a_user_pattern_stops_at_a_scope_edge_whatever_its_extra_check_says(traced) -> None:
    x, y = torch.randn(8), torch.randn(8)
    npugraph_ex.register_replacement(
        double_then_add, add_twice, [x, y], extra_check=lambda match: True, skip_duplicates=True
    )
    spanning = traced(doubled_in_scope, x, y)
    fuse_patterns(spanning.gm, spanning.inputs, Config())
    assert spanning.op_counts()["aten.mul.Tensor"] == 1
    inside = traced(doubled_with_scope, x, y)
    fuse_patterns(inside.gm, inside.inputs, Config())
    assert inside.op_counts()["aten.mul.Tensor"] == 0
    assert inside.op_counts()["aten.add.Tensor"] == 2
    torch.testing.assert_close(inside.gm(x, y)[0], doubled_with_scope(x, y))


def scaled_exp(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.exp(x) * scale


def test_functions_of_different_arities_are_refused_at_registration() -> None:
    patterns_before = {key: len(entries) for key, entries in registry().patterns.items()}
    with pytest.raises(TypeError) as error:
        npugraph_ex.register_replacement(sinh_plus_cosh, scaled_exp, [torch.randn(4)])
    assert str(error.value) == (
        "register_replacement: search function sinh_plus_cosh() takes 1 argument but "
        "replacement function scaled_exp() takes 2 arguments; both must take the same "
        "arguments, in the same order, one per example input"
    )
    assert {key: len(entries) for key, entries in registry().patterns.items()} == patterns_before


def test_example_inputs_must_match_the_arguments() -> None:
    with pytest.raises(TypeError) as error:
        npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4), torch.randn(4)])
    assert str(error.value) == (
        "register_replacement: search function sinh_plus_cosh() takes 1 argument but 2 example "
        "inputs were given; give one example input per argument"
    )
