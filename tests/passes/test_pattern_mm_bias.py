"""The built-in mm + bias pattern."""

from __future__ import annotations

from collections import Counter

import pytest
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


def plus(x: torch.Tensor, w: torch.Tensor, bias) -> torch.Tensor:  # noqa: ANN001
    return x @ w + bias


def few_ulps(dtype: torch.dtype) -> dict[str, float]:
    """A few units in the last place (``addmm`` rounds once where mm + add round twice, and may
    sum in another order); exact for integers."""
    eps = 4 * torch.finfo(dtype).eps if dtype.is_floating_point else 0
    return dict(rtol=eps, atol=eps) if eps else {}


M, K, N = 5, 3, 4


@pytest.mark.parametrize(
    ("bias", "applies"),
    [
        (1, False),
        (0.5, False),
        (torch.tensor(0.5), True),
        (torch.tensor(2, dtype=torch.int64), False),  # a 0-d int tensor: the add keeps float32
    ],
    ids=["int", "float", "0-d tensor", "0-d int tensor"],
)
def test_scalar_biases(fused, bias, applies) -> None:
    # A Python number is not a tensor addmm can take (it used to fail the pass).
    if isinstance(bias, torch.Tensor):
        result = fused(plus, torch.randn(M, K), torch.randn(K, N), bias)
    else:
        result = fused(lambda x, w: plus(x, w, bias), torch.randn(M, K), torch.randn(K, N))
    assert result.applied(aten.addmm.default) if applies else result.refused()
    result.assert_close(**few_ulps(torch.float32))


@pytest.mark.parametrize(
    ("shape", "applies"),
    [((N,), True), ((1, N), True), ((M, 1), True), ((M, N), True), ((2, M, N), False)],
    ids=["row", "1xN", "Mx1", "MxN", "grows the product"],
)
def test_broadcast_biases(fused, shape, applies) -> None:
    result = fused(plus, torch.randn(M, K), torch.randn(K, N), torch.randn(shape))
    assert result.applied(aten.addmm.default) if applies else result.refused()
    result.assert_close(**few_ulps(torch.float32))


@pytest.mark.parametrize(
    ("dtype", "bias_dtype", "applies"),
    [
        (torch.float16, torch.float16, True),
        (torch.bfloat16, torch.bfloat16, True),
        (torch.float64, torch.float64, True),
        (torch.int64, torch.int64, True),
        (torch.int32, torch.int32, True),
        (torch.float32, torch.float64, False),  # the add promotes to float64
        (torch.float32, torch.float16, False),
        (torch.int64, torch.float32, False),
    ],
    ids=str,
)
def test_other_dtypes(fused, dtype, bias_dtype, applies) -> None:
    def make(*shape, dtype):  # noqa: ANN001, ANN202
        if dtype.is_floating_point:
            return torch.randn(shape, dtype=dtype)
        return torch.randint(-4, 5, shape, dtype=dtype)

    x, w, bias = make(M, K, dtype=dtype), make(K, N, dtype=dtype), make(N, dtype=bias_dtype)
    result = fused(plus, x, w, bias)
    assert result.applied(aten.addmm.default) if applies else result.refused()
    result.assert_close(**few_ulps(result.expected[0].dtype))


def test_non_contiguous_operands(fused) -> None:
    x, w = torch.randn(K, M).t(), torch.randn(N, K).t()
    bias = torch.randn(2 * N)[::2]
    assert not (x.is_contiguous() or w.is_contiguous() or bias.is_contiguous())
    result = fused(plus, x, w, bias)
    assert result.applied(aten.addmm.default)
    result.assert_close(**few_ulps(torch.float32))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@torch.no_grad()
def test_a_number_added_to_a_product_compiles(dynamic) -> None:
    compiled = torch.compile(lambda a, b: a @ b + 1, backend="npugraph_ex", dynamic=dynamic)
    for rows in (3, 5):
        a, b = torch.randn(rows, 4), torch.randn(4, 6)
        assert torch.equal(compiled(a, b), a @ b + 1)


def test_an_operand_written_between_product_and_add_is_not_read_after_the_write() -> None:
    # A graph that is not functional (a custom pass may leave one): addmm at the add would read
    # x after the in-place write, where the product read it before. The matcher refuses matches
    # across an in-place op.
    from torch.fx.experimental.proxy_tensor import make_fx

    def written(x, w, b):  # noqa: ANN001, ANN202
        p = torch.mm(x, w)
        x.mul_(2)
        return p + b

    args = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    gm = make_fx(written)(*(a.clone() for a in args))
    before = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    fuse_patterns(gm, list(args), Config())
    after = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    assert after == before and after["aten.mm.default"] == 1
    assert torch.equal(gm(*(a.clone() for a in args)), written(*(a.clone() for a in args)))
