"""input_inplace_pass: a functional write copied back into an input becomes an in-place write."""

from __future__ import annotations

import pytest
import torch

import npugraph_ex
from helpers import kernels_per_replay
from npugraph_ex.config import Config
from npugraph_ex.passes.reinplace_inputs import reinplace_inputs

aten = torch.ops.aten


def kv_write(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(2, pos, k)
    return (cache * 2).sum(-1)


def put_rows(buf: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    buf[rows] = values
    return buf.mean(0)


def write_columns(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    buf[:, 1:3] = x
    return buf + 1


def write_row(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    buf[2] = x
    return buf.sum()


def counter_step(count: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    count.add_(1)
    return x * count


def add_returned(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(y)
    return x  # the graph returns the copy back into x


def kv_write_returned(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(2, pos, k)
    return cache


CASES = {
    "index_copy": (
        kv_write,
        lambda: (torch.zeros(1, 2, 8, 4), torch.tensor([3]), torch.randn(1, 2, 1, 4)),
        {aten.index_copy.default: -1, aten.index_copy_.default: 1, aten.copy_.default: -1},
    ),
    "index_put": (
        put_rows,
        lambda: (torch.zeros(6, 3), torch.tensor([1, 4]), torch.randn(2, 3)),
        {aten.index_put.default: -1, aten.index_put_.default: 1, aten.copy_.default: -1},
    ),
    "slice_scatter": (
        write_columns,
        lambda: (torch.zeros(4, 5), torch.randn(4, 2)),
        {aten.slice_scatter.default: -1, aten.slice.Tensor: 1},  # copy_ moves onto the view
    ),
    "select_scatter": (
        write_row,
        lambda: (torch.zeros(4, 5), torch.randn(5)),
        {aten.select_scatter.default: -1, aten.select.int: 1},
    ),
    "add": (
        counter_step,
        lambda: (torch.zeros(()), torch.randn(3)),
        {aten.add.Tensor: -1, aten.add_.Tensor: 1, aten.copy_.default: -1},
    ),
    "add, input returned": (
        add_returned,
        lambda: (torch.zeros(3), torch.randn(3)),
        {aten.add.Tensor: -1, aten.add_.Tensor: 1, aten.copy_.default: -1},
    ),
    "index_copy, input returned": (
        kv_write_returned,
        lambda: (torch.zeros(1, 2, 8, 4), torch.tensor([3]), torch.randn(1, 2, 1, 4)),
        {aten.index_copy.default: -1, aten.index_copy_.default: 1, aten.copy_.default: -1},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_write_lands_in_the_input_without_a_copy_back(traced, case) -> None:
    fn, make_inputs, change = CASES[case]
    graph = traced(fn, *make_inputs())
    before = {target: graph.count(target) for target in change}
    reinplace_inputs(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    after = {target: graph.count(target) for target in change}
    assert {t: after[t] - before[t] for t in change} == change


@pytest.mark.parametrize("case", sorted(CASES))
@torch.no_grad()
def test_replays_write_the_callers_input_as_eager_does(case) -> None:
    fn, make_inputs, _ = CASES[case]
    compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
    written = make_inputs()[0]
    mine, theirs = written.clone(), written.clone()  # the written input stays at one address
    for _ in range(3):
        rest = make_inputs()[1:]
        rest[-1].copy_(torch.randn_like(rest[-1]))
        assert torch.equal(compiled(mine, *rest), fn(theirs, *rest))
        assert torch.equal(mine, theirs)
    assert npugraph_ex.stats()["totals"]["replays"] == 2


def copy_from_itself(cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(0, pos, cache[1:2])  # the source is a view of the input being written
    return cache.sum()


def test_a_source_that_views_the_input_keeps_the_functional_write(traced) -> None:
    graph = traced(copy_from_itself, torch.randn(4, 3), torch.tensor([3]))
    before = graph.op_counts()
    reinplace_inputs(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


def read_old_value_later(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor):
    old = cache.clone()  # traced as a read of the input
    cache.index_copy_(0, pos, k)
    return old.sum() + cache.sum()


def test_reads_of_the_input_before_the_write_do_not_block_it(traced) -> None:
    graph = traced(read_old_value_later, torch.randn(4, 3), torch.tensor([2]), torch.randn(1, 3))
    reinplace_inputs(graph.gm, graph.inputs, Config())
    assert graph.count(aten.index_copy_.default) == 1


@torch.no_grad()
def test_turning_the_option_off_keeps_the_copy_back() -> None:
    kernels = {}
    for enabled in (True, False):
        npugraph_ex.reset_stats()
        torch._dynamo.reset()
        fn = torch.compile(
            kv_write, backend="npugraph_ex", fullgraph=True, options={"input_inplace_pass": enabled}
        )
        inputs = CASES["index_copy"][1]()
        fn(*inputs)
        kernels[enabled] = kernels_per_replay()
    assert kernels[False] - kernels[True] == 1  # the copy back


@torch.library.custom_op("npugraph_ex_tests::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


@scale_.register_fake
def scale_fake(x: torch.Tensor, factor: float) -> None:
    return None


def custom_op_write(buf: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    scale_(buf, 2.0)
    return buf + y


def custom_op_write_old_value_read(buf: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    old = buf * 1.5  # read before the write: the op may still run in place
    scale_(buf, 2.0)
    return buf + y + old


@pytest.mark.parametrize("fn", [custom_op_write, custom_op_write_old_value_read])
def test_a_mutating_custom_op_runs_in_place_on_the_input(traced, fn) -> None:
    graph = traced(fn, torch.ones(4), torch.ones(4))
    counts = graph.op_counts()
    assert counts["auto_functionalized_v2"] == 1 and counts["aten.copy_.default"] == 1
    reinplace_inputs(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    counts = graph.op_counts()
    assert counts["npugraph_ex_tests.scale_.default"] == 1
    assert counts["auto_functionalized_v2"] == 0
    assert counts["aten.copy_.default"] == 0 and counts["aten.clone.default"] == 0


@pytest.mark.parametrize("fn", [custom_op_write, custom_op_write_old_value_read])
@torch.no_grad()
def test_a_mutating_custom_op_replays_like_eager(fn) -> None:
    compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
    mine, theirs = torch.randn(4), None
    theirs = mine.clone()
    for _ in range(3):
        y = torch.randn(4)
        assert torch.equal(compiled(mine, y), fn(theirs, y))
        assert torch.equal(mine, theirs)
    assert npugraph_ex.stats()["totals"]["replays"] == 2


@pytest.mark.parametrize("fn", [add_returned, kv_write_returned])
@torch.no_grad()
def test_a_returned_input_is_the_callers_tensor_as_in_eager(fn) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
    make_inputs = CASES[
        "add, input returned" if fn is add_returned else "index_copy, input returned"
    ][1]
    mine = make_inputs()[0]
    for _ in range(3):
        rest = make_inputs()[1:]
        assert compiled(mine, *rest) is mine
