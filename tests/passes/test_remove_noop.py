"""remove_noop_ops: ops that return their input unchanged disappear, unless aliasing forbids it."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_trees_equal
from npugraph_ex.config import Config
from npugraph_ex.passes.remove_noop import remove_noop_ops

aten = torch.ops.aten


def identities(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w
    h = h * 1
    h = h + 0
    h = h - 0
    h = h / 1
    h = h.pow(1)
    h = torch.cat([h]).clone().to(torch.float32)
    return h.view(h.shape).reshape(h.shape)[:, : h.shape[1]].relu()


def real_work(x: torch.Tensor) -> torch.Tensor:
    return (x * 2 + 1).pow(2)[:, 1:].to(torch.float64)


def graph_output_clone(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.sin()
    return y, y.clone()  # dropping the clone would make the two outputs one tensor


def input_clone_then_write(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    old = cache.clone()  # the clone keeps the old value; the input is written afterwards
    cache.add_(x)
    return old * 2


def counts(graph) -> dict[str, int]:
    return {k: v for k, v in graph.op_counts().items() if not k.startswith("aten.mm")}


def test_identities_and_whole_views_disappear(traced) -> None:
    graph = traced(identities, torch.randn(4, 8), torch.randn(8, 8))
    assert sum(counts(graph).values()) >= 11
    remove_noop_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    assert counts(graph) == {"aten.relu.default": 1}


def test_ops_that_change_something_stay(traced) -> None:
    graph = traced(real_work, torch.randn(4, 8))
    before = graph.op_counts()
    remove_noop_ops(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


@pytest.mark.parametrize(
    ("fn", "make_inputs", "kept"),
    [
        (graph_output_clone, lambda: (torch.randn(3),), "aten.clone.default"),
        (input_clone_then_write, lambda: (torch.randn(3), torch.randn(3)), "aten.clone.default"),
    ],
    ids=["clone that is an output", "clone of an input written later"],
)
def test_copies_whose_removal_could_be_observed_stay(traced, fn, make_inputs, kept) -> None:
    graph = traced(fn, *make_inputs())
    assert graph.op_counts()[kept] == 1
    remove_noop_ops(graph.gm, graph.inputs, Config())
    assert graph.op_counts()[kept] == 1


@pytest.mark.parametrize("fn", [identities, graph_output_clone, input_clone_then_write])
@torch.no_grad()
def test_results_are_those_of_eager_with_the_pass_on_and_off(fn) -> None:
    inputs = {
        identities: lambda: (torch.randn(4, 8), torch.randn(8, 8)),
        graph_output_clone: lambda: (torch.randn(3),),
        input_clone_then_write: lambda: (torch.randn(3), torch.randn(3)),
    }[fn]()
    for enabled in (True, False):
        torch._dynamo.reset()
        compiled = torch.compile(
            fn, backend="npugraph_ex", fullgraph=True, options={"remove_noop_ops": enabled}
        )
        for _ in range(2):
            mine, theirs = [t.clone() for t in inputs], [t.clone() for t in inputs]
            got, expected = compiled(*mine), fn(*theirs)
            assert_trees_equal(got, expected)
            for a, b in zip(mine, theirs, strict=True):
                assert torch.equal(a, b)
        if fn is graph_output_clone:
            first, second = compiled(inputs[0].clone())
            assert first.data_ptr() != second.data_ptr()
