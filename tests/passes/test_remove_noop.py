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


def transposed_clone(x: torch.Tensor) -> torch.Tensor:
    return x.clone().t()  # dropping the clone would return a view of the caller's input


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
        (transposed_clone, lambda: (torch.randn(3, 4),), "aten.clone.default"),
    ],
    ids=["clone that is an output", "clone of an input written later", "clone viewed as output"],
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


VIEWED_COPIES = {
    "clone": transposed_clone,
    "times one": lambda x: (x * 1.0).t(),
    "plus zero": lambda x: (x + 0).view(-1),
    "divided by one": lambda x: (x / 1).unsqueeze(0),
    "copy into zeros": lambda x: torch.zeros_like(x).copy_(x).t(),
}


@pytest.mark.parametrize("kernels", [False, True], ids=["aten", "kernels"])
@pytest.mark.parametrize("fn", VIEWED_COPIES.values(), ids=VIEWED_COPIES.keys())
@torch.no_grad()
def test_a_view_of_a_copy_returned_is_a_new_tensor_on_every_call(fn, kernels: bool) -> None:  # noqa: ANN001
    # Eager returns a view of a new tensor; the kernels returned a view of the caller's input
    # from the second call on (the first runs the captured graph), and writing to it wrote to x.
    compiled = torch.compile(fn, backend="npugraph_ex", options={"static_kernel_compile": kernels})
    for _ in range(3):
        x = torch.randn(3, 4)
        kept = x.clone()
        out = compiled(x)
        assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        assert out.stride() == fn(x).stride()
        out.add_(1)
        assert torch.equal(x, kept)


def full_slices(x: torch.Tensor) -> torch.Tensor:
    return x[:].sin() + x[:, : x.shape[1]].cos()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_full_slices_go_however_their_end_is_written(traced, dynamic) -> None:
    # Dynamic shapes: x[:] ends at sys.maxsize, x[:, :n] at a symbolic size equal to the dim's.
    graph = traced(full_slices, torch.randn(4, 6), dynamic=dynamic)
    assert graph.op_counts()["aten.slice.Tensor"] >= 1
    remove_noop_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    assert graph.op_counts()["aten.slice.Tensor"] == 0
    assert graph.op_counts()["aten.sin.default"] == 1


def partial_slices(x: torch.Tensor) -> torch.Tensor:
    return x[1:].sin() + x[:-1].cos() + x[::2].sum()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_partial_slices_stay(traced, dynamic) -> None:
    graph = traced(partial_slices, torch.randn(4, 6), dynamic=dynamic)
    before = graph.op_counts()
    remove_noop_ops(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


def copy_into(factory: str):  # noqa: ANN201
    def fn(x: torch.Tensor) -> torch.Tensor:
        fresh = {
            "zeros_like": lambda: torch.zeros_like(x),
            "empty_like": lambda: torch.empty_like(x),
            "full_like": lambda: torch.full_like(x, 7.0),
            "zeros": lambda: torch.zeros(x.shape),
        }[factory]()
        fresh.copy_(x)
        return fresh.sin()

    return fn


FACTORIES = ["zeros_like", "empty_like", "full_like", "zeros"]


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_copy_into_a_fresh_tensor_is_its_source(traced, factory) -> None:
    graph = traced(copy_into(factory), torch.randn(4, 6))
    assert graph.op_counts()["aten.copy.default"] == 1
    remove_noop_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    assert {k: v for k, v in graph.op_counts().items() if v} == {"aten.sin.default": 1}


def returned_copy_into_fresh(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x).copy_(x)


def copy_into_other_dtype(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x, dtype=torch.float64).copy_(x).sin()


def copy_into_read_fresh(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = torch.zeros_like(x)
    before = z.sum()  # the zeros are read: the factory stays
    return z.copy_(x).sin(), before


def test_a_returned_copy_into_a_fresh_tensor_becomes_a_clone(traced) -> None:
    # A clone, not the input: an output must not alias the input where eager's did not.
    graph = traced(returned_copy_into_fresh, torch.randn(4, 6))
    remove_noop_ops(graph.gm, graph.inputs, Config())
    counts = {k: v for k, v in graph.op_counts().items() if v}
    assert counts == {"aten.clone.default": 1}


@pytest.mark.parametrize("fn", [copy_into_other_dtype, copy_into_read_fresh])
def test_copies_that_convert_or_whose_factory_is_read_stay(traced, fn) -> None:
    graph = traced(fn, torch.randn(4, 6))
    before = graph.op_counts()
    remove_noop_ops(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


@pytest.mark.parametrize(
    "fn",
    [
        full_slices,
        partial_slices,
        *(copy_into(name) for name in FACTORIES),
        returned_copy_into_fresh,
        copy_into_other_dtype,
        copy_into_read_fresh,
    ],
)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@torch.no_grad()
def test_slices_and_copies_give_eager_results(fn, dynamic) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True, dynamic=dynamic)
    for rows in (4, 5):
        x = torch.randn(rows, 6)
        got, expected = compiled(x), fn(x)
        assert_trees_equal(got, expected)
        if fn is returned_copy_into_fresh:
            assert got.data_ptr() != x.data_ptr()
