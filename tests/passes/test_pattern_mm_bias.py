"""The built-in mm + bias pattern."""

from __future__ import annotations

import torch

from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns

aten = torch.ops.aten


def project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (x @ w + b).tanh()


def project_twice(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    p = x @ w
    return p + b, p.sum()  # the product is needed on its own too


def inputs():
    return torch.randn(5, 3), torch.randn(3, 4), torch.randn(4)


def test_product_and_bias_become_one_addmm(traced) -> None:
    graph = traced(project, *inputs())
    fuse_patterns(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.addmm.default"] == 1
    assert counts["aten.mm.default"] == 0 and counts["aten.add.Tensor"] == 0


def test_a_product_used_elsewhere_is_kept(traced) -> None:
    graph = traced(project_twice, *inputs())
    before = graph.op_counts()
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


@torch.no_grad()
def test_results_are_within_the_documented_tolerance() -> None:
    compiled = torch.compile(project, backend="npugraph_ex", fullgraph=True)
    for _ in range(3):
        args = inputs()
        torch.testing.assert_close(compiled(*args), project(*args), atol=1e-6, rtol=0)
