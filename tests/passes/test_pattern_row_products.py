"""The built-in few-row product pattern: ``mm`` of up to 8 rows becomes a ``bmm`` split over the
intra-op threads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from helpers import GraphRecorder, intra_op_threads
from models import TINY_QWEN3, make_tiny_qwen3
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns

MM, BMM = "aten.mm.default", "aten.bmm.default"
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
"""Another kernel sums each dot product, perhaps in another order."""


@pytest.fixture
def threads() -> Iterator[None]:
    """Two intra-op threads for the test (the pattern splits the rows into that many blocks)."""
    with intra_op_threads(2):
        yield


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def fused_counts(traced, x: torch.Tensor, w: torch.Tensor, **options) -> dict[str, int]:  # noqa: ANN001
    graph = traced(product, x, w)
    fuse_patterns(graph.gm, graph.inputs, Config(**options))
    graph.gm.graph.lint()
    counts = graph.op_counts()
    return {MM: counts[MM], BMM: counts[BMM]}


@pytest.mark.parametrize("rows", [1, 4, 8])
def test_a_few_row_product_becomes_a_split_batched_product(traced, threads, rows) -> None:
    assert fused_counts(traced, torch.randn(rows, 16), torch.randn(8, 16)) == {MM: 0, BMM: 1}


@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 3])
def test_results_are_within_tolerance_and_row_major(threads, rows) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(product, backend="npugraph_ex", fullgraph=True)
    for _ in range(2):  # a capture, then a replay
        x, w = torch.randn(rows, 64), torch.randn(32, 64)
        got = compiled(x, w)
        torch.testing.assert_close(got, product(x, w), **TOLERANCE)
        assert got.is_contiguous()


@pytest.mark.parametrize(
    ("rows", "weight_rows", "dtype"),
    [(9, 8, torch.float32), (1, 7, torch.float32), (1, 8, torch.float64)],
    ids=["nine rows", "rows that do not split", "float64"],
)
def test_what_it_does_not_split(traced, threads, rows, weight_rows, dtype) -> None:
    x, w = torch.randn(rows, 16, dtype=dtype), torch.randn(weight_rows, 16, dtype=dtype)
    assert fused_counts(traced, x, w) == {MM: 1, BMM: 0}


def test_one_thread_or_static_kernels_leave_it_alone(traced, threads) -> None:
    x, w = torch.randn(1, 16), torch.randn(8, 16)
    assert fused_counts(traced, x, w, static_kernel_compile=True) == {MM: 1, BMM: 0}
    with intra_op_threads(1):
        assert fused_counts(traced, x, w) == {MM: 1, BMM: 0}


@torch.no_grad()
def test_every_product_of_a_qwen3_decode_step_is_split(threads) -> None:
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    model, recorder = make_tiny_qwen3(), GraphRecorder()
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    eager_cache = transformers.StaticCache(config=model.config, max_cache_len=16)

    def step(ids, pos, cache):  # noqa: ANN001, ANN202
        return model(input_ids=ids, past_key_values=cache, cache_position=pos).logits

    compiled = torch.compile(
        step,
        backend="npugraph_ex",
        fullgraph=True,
        options={"post_grad_custom_post_pass": recorder},
    )
    ids = eager_ids = torch.tensor([[1]])
    for position in range(6):  # the first call initialises the cache: its own graph
        pos = torch.tensor([position])
        logits, expected = compiled(ids, pos, cache), step(eager_ids, pos, eager_cache)
        torch.testing.assert_close(logits, expected, **TOLERANCE)
        ids, eager_ids = logits[:, -1:].argmax(-1), expected[:, -1:].argmax(-1)
        assert torch.equal(ids, eager_ids)
    # Per layer: q, k, v, o, gate, up and down projections; then the output head.
    products = 7 * TINY_QWEN3["num_hidden_layers"] + 1
    counts = [sum(str(n.target) == BMM for n in gm.graph.nodes) for gm in recorder.graphs]
    assert counts[-1] == products
    assert not any(str(n.target) == MM for n in recorder.graphs[-1].graph.nodes)
