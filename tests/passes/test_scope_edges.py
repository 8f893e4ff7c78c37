"""Patterns never match across the edge of a scope (``npugraph_ex.scope``): a fusion would move
ops into or out of the block that governs how they run."""

from __future__ import annotations

import pytest
import torch

from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.scope import limit_core_num, stream

ADDMM = "aten.addmm.default"


def inputs():
    return torch.randn(5, 3), torch.randn(3, 4), torch.randn(4)


def product_in_scope(x, w, b):
    with stream("branch"):
        p = x @ w
    return (p + b).tanh()


def bias_in_nested_scope(x, w, b):
    with limit_core_num(1, 1):
        p = x @ w
        with stream("branch"):
            y = p + b
    return y.tanh()


def all_in_scope(x, w, b):
    with limit_core_num(1, 1):
        y = x @ w + b
    return y.tanh()


def scope_in_between(x, w, b):
    p = x @ w
    with stream("branch"):
        s = x.sum()
    return (p + b).tanh() * s


def fused(traced, fn):
    graph = traced(fn, *inputs())
    fuse_patterns(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    return graph.op_counts()


@pytest.mark.parametrize(
    "fn", [product_in_scope, bias_in_nested_scope, scope_in_between], ids=lambda f: f.__name__
)
def test_a_product_and_bias_on_two_sides_of_a_scope_edge_stay_apart(traced, fn) -> None:
    counts = fused(traced, fn)
    assert counts[ADDMM] == 0
    assert counts["aten.mm.default"] == 1 and counts["aten.add.Tensor"] == 1


def test_a_pattern_wholly_inside_a_scope_is_fused_there(traced) -> None:
    graph = traced(all_in_scope, *inputs())
    fuse_patterns(graph.gm, graph.inputs, Config())
    order = [str(n.target) for n in graph.gm.graph.nodes if n.op == "call_function"]
    assert order == [
        "npugraph_ex.scope_enter.default",
        ADDMM,
        "npugraph_ex.scope_exit.default",
        "aten.tanh.default",
    ]
