"""remove_cat_ops: producers made only for a cat write straight into its result."""

from __future__ import annotations

import torch

import npugraph_ex
from helpers import assert_trees_equal, kernels_per_replay
from npugraph_ex.config import Config
from npugraph_ex.passes.remove_cat import remove_cat_ops

aten = torch.ops.aten


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """As Hugging Face rotary embeddings write it."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1) * 2


def two_products(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.cat([x @ w, (x @ v).relu()], dim=0).sum(0)


def shared_producer(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.sin()
    return torch.cat([s, x.cos()]), s * 2  # s is needed on its own: only cos writes in place


def only_views(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:2], x[2:]]) + 1  # nothing is made for the cat: nothing to save


def promoted(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.cat([x.sin(), i.abs()])  # cat promotes the int part: abs may not write a float


def appended_to_empty(x: torch.Tensor) -> torch.Tensor:
    # An empty 1-d tensor is how a cache starts out; cat skips it whatever the other parts' dims.
    return torch.cat([torch.tensor([]), x.neg()], dim=-2)


def test_a_producer_writes_its_slice_and_the_rest_is_copied(traced) -> None:
    graph = traced(rotate_half, torch.randn(2, 4, 1, 8))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0 and counts["aten.neg.default"] == 0
    assert counts["aten.neg.out"] == 1 and counts["aten.copy_.default"] == 1


def test_every_producer_made_for_the_cat_writes_in_place(traced) -> None:
    graph = traced(two_products, torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 5))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0 and counts["aten.copy_.default"] == 0
    assert counts["aten.mm.out"] == 1 and counts["aten.relu.out"] == 1


def test_a_producer_with_other_users_is_copied(traced) -> None:
    graph = traced(shared_producer, torch.randn(4))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.sin.default"] == 1 and counts["aten.cos.out"] == 1
    assert counts["aten.copy_.default"] == 1


def test_a_cat_with_nothing_to_save_stays(traced) -> None:
    graph = traced(only_views, torch.randn(5))
    before = graph.op_counts()
    remove_cat_ops(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


def test_a_part_the_cat_promotes_is_copied_with_its_conversion(traced) -> None:
    graph = traced(promoted, torch.randn(3), torch.arange(3))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.sin.out"] == 1 and counts["aten.abs.default"] == 1
    assert counts["aten.copy_.default"] == 1


def test_an_empty_part_the_cat_skips_is_left_out(traced) -> None:
    graph = traced(appended_to_empty, torch.randn(1, 2, 3, 4))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0 and counts["aten.neg.out"] == 1
    assert counts["aten.copy_.default"] == 0


@torch.no_grad()
def test_results_match_eager_and_the_option_turns_it_off() -> None:
    cases = [
        (rotate_half, lambda: (torch.randn(2, 4, 1, 8),)),
        (two_products, lambda: (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 5))),
        (shared_producer, lambda: (torch.randn(4),)),
        (promoted, lambda: (torch.randn(3), torch.arange(3))),
        (appended_to_empty, lambda: (torch.randn(1, 2, 3, 4),)),
    ]
    for fn, make in cases:
        kernels = {}
        for enabled in (True, False):
            torch._dynamo.reset()
            npugraph_ex.reset_stats()  # the other graph may outlive the reset until collected
            compiled = torch.compile(
                fn, backend="npugraph_ex", fullgraph=True, options={"remove_cat_ops": enabled}
            )
            for _ in range(2):
                args = make()
                assert_trees_equal(compiled(*args), fn(*args))
            kernels[enabled] = kernels_per_replay()
        if fn is two_products:
            assert kernels[True] == kernels[False] - 1  # the cat's copy is gone
