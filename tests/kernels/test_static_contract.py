"""The capture contract's input and output rules hold when keys run static kernels.

A few rules of ``tests/capture/test_contract.py`` again, on graphs whose keys run Inductor
kernels instead of the ATen graph (each key costs an Inductor compile, so only the rules the
kernels could break: odd inputs, outputs aliasing inputs, inputs used in place).
"""

from __future__ import annotations

import pytest
import torch

from helpers import graphs_called

ATOL = 1e-5
"""Inductor's fused loops sum in another order than ATen's kernels."""

pytestmark = pytest.mark.slow


def static(fn, *, dynamic: bool = True, **options):
    options = {"static_kernel_compile": True, **options}
    return torch.compile(
        fn, backend="npugraph_ex", fullgraph=True, dynamic=dynamic, options=options
    )


def kernels_made() -> dict[str, int]:
    made: dict[str, int] = {}
    for graph in graphs_called():
        for outcome, count in graph["static_kernels"].items():
            made[outcome] = made.get(outcome, 0) + count
    return made


@torch.no_grad()
def test_unusual_inputs() -> None:
    def fn(x, empty, scale, n: int, factor: float):
        return x.t() @ x * scale + n * factor, empty.sum(0), x[:, :n]

    graph = static(fn)
    for n in (1, 2, 2):
        x = torch.randn(6, 4).t()  # non-contiguous
        empty = torch.randn(0, 3)
        scale = torch.tensor(1.5 + n)  # 0-d tensor
        got, expected = graph(x, empty, scale, n, 0.5), fn(x, empty, scale, n, 0.5)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, atol=ATOL, rtol=0)
    assert set(kernels_made()) <= {"compiled", "cache_hit"}
    assert sum(kernels_made().values()) == 2


@torch.no_grad()
def test_outputs_aliasing_inputs_alias_the_callers_tensor() -> None:
    def views(x: torch.Tensor):
        return x, x[1], x.view(-1), x + 1

    fn = static(views, dynamic=False)
    for _ in range(3):
        x = torch.randn(3, 4)
        same, row, flat, plus = fn(x)
        assert same is x
        assert row.data_ptr() == x[1].data_ptr()
        assert flat.data_ptr() == x.data_ptr()
        torch.testing.assert_close(plus, x + 1, atol=ATOL, rtol=0)
        assert plus.data_ptr() != x.data_ptr()


@torch.no_grad()
@pytest.mark.parametrize("clone_input", [True, False])
def test_each_call_reads_its_own_inputs(clone_input: bool) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * y.sum()

    graph = static(fn, dynamic=False, clone_input=clone_input)
    for _ in range(3):
        x, y = torch.randn(4, 4), torch.randn(4)
        torch.testing.assert_close(graph(x, y), fn(x, y), atol=ATOL, rtol=0)
    [stats] = graphs_called()
    assert (stats["captures"], stats["replays"]) == (1, 2)
