"""inplace_pass: functional ops on intermediates nobody reads afterwards write them in place."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_trees_equal
from npugraph_ex.config import Config
from npugraph_ex.passes.reinplace import reinplace

aten = torch.ops.aten


def chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w
    return (h.relu() * 2 + 1).sigmoid()


def read_later(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w
    r = h.relu()
    return r + h  # h is read after relu: relu may not overwrite it


def output_kept(x: torch.Tensor, w: torch.Tensor):
    h = x @ w
    return h, h.relu()  # h is an output


def view_read_later(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w
    first = h[0]
    return h.sigmoid() + first  # a view of h is read after sigmoid


def input_first(x: torch.Tensor) -> torch.Tensor:
    return x.relu() * 2  # relu's input is a graph input: never written


def broadcast(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    h = x.sum(0)
    return h + b  # the result is larger than h: no in-place form


INPUTS = {
    chain: lambda: (torch.randn(3, 4), torch.randn(4, 5)),
    read_later: lambda: (torch.randn(3, 4), torch.randn(4, 5)),
    output_kept: lambda: (torch.randn(3, 4), torch.randn(4, 5)),
    view_read_later: lambda: (torch.randn(3, 4), torch.randn(4, 5)),
    input_first: lambda: (torch.randn(3, 4),),
    broadcast: lambda: (torch.randn(3, 4), torch.randn(2, 4)),
}


def test_a_chain_on_a_dead_intermediate_runs_in_place(traced) -> None:
    graph = traced(chain, *INPUTS[chain]())
    reinplace(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    counts = graph.op_counts()
    for op in ("relu", "mul", "add", "sigmoid"):
        assert counts[f"aten.{op}_.{'default' if op in ('relu', 'sigmoid') else 'Tensor'}"] == 1
    assert counts["aten.mm.default"] == 1  # mm's inputs are graph inputs


@pytest.mark.parametrize(
    ("fn", "kept"),
    [
        (read_later, "aten.relu.default"),
        (output_kept, "aten.relu.default"),
        (view_read_later, "aten.sigmoid.default"),
        (input_first, "aten.relu.default"),
        (broadcast, "aten.add.Tensor"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_an_input_that_is_still_needed_is_not_written(traced, fn, kept) -> None:
    graph = traced(fn, *INPUTS[fn]())
    assert graph.op_counts()[kept] == 1
    reinplace(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    packet, overload = kept.rsplit(".", 1)
    assert counts[kept] == 1 and counts[f"{packet}_.{overload}"] == 0


@pytest.mark.parametrize("fn", list(INPUTS), ids=lambda f: f.__name__)
@torch.no_grad()
def test_results_match_eager(fn) -> None:
    compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
    for _ in range(2):
        inputs = INPUTS[fn]()
        got, expected = compiled(*inputs), fn(*inputs)
        assert_trees_equal(got, expected)
