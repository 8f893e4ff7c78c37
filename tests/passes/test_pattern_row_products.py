"""The built-in few-row product patterns: ``mm`` of up to 8 rows becomes a ``bmm`` split over the
intra-op threads, and ``addmm`` with a bias per weight row a ``baddbmm``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import torch

from helpers import GraphRecorder, intra_op_threads
from models import make_tiny_qwen2, make_tiny_qwen3
from npugraph_ex.bench.presets import QWEN3_PRESETS
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.runtime.cpu import probes as host_probes
from npugraph_ex.runtime.cpu.platform import SPLIT_MIN_WEIGHT_ELEMENTS as MIN_WEIGHT_ELEMENTS
from npugraph_ex.scope import limit_core_num, stream

MM, BMM = "aten.mm.default", "aten.bmm.default"
ADDMM, BADDBMM = "aten.addmm.default", "aten.baddbmm.default"
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
"""Another kernel sums each dot product, perhaps in another order (here sums of 128 products of
unit-scale values, about 11 in size)."""


THREADS = 2
"""Intra-op threads of the ``threads`` fixture (the pattern cuts rows into that many blocks)."""


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``THREADS`` intra-op threads, on a host where the split pays (whatever this one says)."""
    monkeypatch.setattr(host_probes, "split_pays", lambda: True)
    with intra_op_threads(THREADS):
        yield


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def product_with_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w, b)


def fused_counts(traced, x: torch.Tensor, w: torch.Tensor, **options) -> dict[str, int]:  # noqa: ANN001
    return op_counts_after(traced, product, (x, w), (MM, BMM), **options)


def op_counts_after(traced, fn, args, ops, **options) -> dict[str, int]:  # noqa: ANN001
    """Counts of ``ops`` in ``fn``'s graph after ``pattern_fusion_pass``."""
    graph = traced(fn, *args)
    fuse_patterns(graph.gm, graph.inputs, Config(**options))
    graph.gm.graph.lint()
    counts = graph.op_counts()
    return {op: counts[op] for op in ops}


SPLIT_WEIGHT = (256, 128)
"""A weight of ``MIN_WEIGHT_ELEMENTS``: the smallest the pattern splits."""


@pytest.mark.parametrize("rows", [1, 4, 8])
def test_a_few_row_product_becomes_a_split_batched_product(traced, threads, rows) -> None:
    x, w = torch.randn(rows, 128), torch.randn(*SPLIT_WEIGHT)
    assert w.numel() == MIN_WEIGHT_ELEMENTS
    assert fused_counts(traced, x, w) == {MM: 0, BMM: 1}


@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 3])
def test_results_are_within_tolerance_and_row_major(threads, rows) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(product, backend="npugraph_ex", fullgraph=True)
    for _ in range(2):  # a capture, then a replay
        x, w = torch.randn(rows, 128), torch.randn(*SPLIT_WEIGHT)
        got = compiled(x, w)
        torch.testing.assert_close(got, product(x, w), **TOLERANCE)
        assert got.is_contiguous()


@pytest.mark.parametrize(
    ("rows", "weight_rows", "dtype"),
    [(9, 256, torch.float32), (1, 257, torch.float32), (1, 254, torch.float32)]
    + [(1, 256, torch.float64)],
    ids=["nine rows", "rows that do not split", "a weight too small", "float64"],
)
def test_what_it_does_not_split(traced, threads, rows, weight_rows, dtype) -> None:
    x, w = torch.randn(rows, 128, dtype=dtype), torch.randn(weight_rows, 128, dtype=dtype)
    assert fused_counts(traced, x, w) == {MM: 1, BMM: 0}


@pytest.mark.parametrize("rows", [1, 4])
def test_a_product_with_a_bias_becomes_one_split_batched_product(traced, threads, rows) -> None:
    args = torch.randn(rows, 128), torch.randn(*SPLIT_WEIGHT), torch.randn(256)
    counts = op_counts_after(traced, product_with_bias, args, (ADDMM, BADDBMM, BMM))
    assert counts == {ADDMM: 0, BADDBMM: 1, BMM: 0}


@pytest.mark.parametrize(
    "bias",
    [torch.randn(1, 256), torch.randn(3, 256), torch.randn(())],
    ids=["a bias row", "a bias per output", "one bias for all"],
)
def test_what_it_does_not_split_with_a_bias(traced, threads, bias) -> None:
    def product_plus(x, w, b):  # noqa: ANN001, ANN202
        return torch.addmm(b, x, w.t())

    args = torch.randn(3, 128), torch.randn(*SPLIT_WEIGHT), bias
    counts = op_counts_after(traced, product_plus, args, (ADDMM, BADDBMM))
    assert counts == {ADDMM: 1, BADDBMM: 0}


@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 3])
def test_results_with_a_bias_are_within_tolerance(threads, rows) -> None:
    torch._dynamo.reset()
    linear = torch.nn.Linear(128, 256)
    compiled = torch.compile(linear, backend="npugraph_ex", fullgraph=True)
    for _ in range(2):  # a capture, then a replay
        x = torch.randn(rows, 128)
        got = compiled(x)
        torch.testing.assert_close(got, linear(x), **TOLERANCE)
        assert got.is_contiguous()


def test_one_thread_or_static_kernels_leave_it_alone(traced, threads) -> None:
    x, w = torch.randn(1, 128), torch.randn(*SPLIT_WEIGHT)
    assert fused_counts(traced, x, w, static_kernel_compile=True) == {MM: 1, BMM: 0}
    with intra_op_threads(1):
        assert fused_counts(traced, x, w) == {MM: 1, BMM: 0}


SPLIT_SIZES = {**QWEN3_PRESETS["tiny"], "num_hidden_layers": 2}


@torch.no_grad()
@pytest.mark.parametrize(
    ("make_model", "with_bias"),
    [(make_tiny_qwen3, ()), (make_tiny_qwen2, ("q", "k", "v"))],
    ids=["qwen3", "qwen2: q, k, v with a bias"],
)
def test_every_product_of_a_decode_step_is_split(threads, make_model, with_bias) -> None:
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    # The tiny benchmark preset's sizes (every weight at least MIN_WEIGHT_ELEMENTS), two layers.
    model, recorder = make_model(**SPLIT_SIZES), GraphRecorder()
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
    # Per layer: q, k, v, o, gate, up and down projections; then the output head. (Some
    # transformers releases compute the rotary angles with a matmul too: a bmm of one block.)
    layers = SPLIT_SIZES["num_hidden_layers"]
    nodes = recorder.graphs[-1].graph.nodes
    counts = Counter(str(n.target) for n in nodes)
    split = Counter(str(n.target) for n in nodes if is_split_product(n))
    assert split[BADDBMM] == len(with_bias) * layers
    assert split[BMM] == (7 - len(with_bias)) * layers + 1
    assert counts[MM] == counts[ADDMM] == 0


def is_split_product(node: torch.fx.Node) -> bool:
    """A ``bmm``/``baddbmm`` whose weight operand is cut into ``THREADS`` blocks."""
    if str(node.target) not in (BMM, BADDBMM):
        return False
    weight = node.args[1 if str(node.target) == BADDBMM else 0]
    return weight.meta["val"].shape[0] == THREADS


def products_in_blocks(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with limit_core_num(1, 1):
        one_thread = x @ w.t()
        with stream("inner"):
            still_one_thread = x @ w.t()
    with limit_core_num(1, 2):
        two_threads = x @ w.t()
    with stream("outer"):
        unlimited = x @ w.t()
    return one_thread + still_one_thread + two_threads + unlimited


def test_a_product_in_a_block_limited_below_the_threads_is_not_split(traced, threads) -> None:
    """Two blocks for a product that runs on one thread would only add a copy: the products in
    (or nested in) ``limit_core_num(1, 1)`` stay ``mm``; ``limit_core_num(1, 2)`` allows both
    threads."""
    x, w = torch.randn(1, 128), torch.randn(*SPLIT_WEIGHT)
    counts = op_counts_after(traced, products_in_blocks, (x, w), (MM, BMM))
    assert counts == {MM: 2, BMM: 2}
    compiled = torch.compile(products_in_blocks, backend="npugraph_ex", fullgraph=True)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x, w), products_in_blocks(x, w), **TOLERANCE)


def linear_plus(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.addmm(b, x, w.t())


@pytest.mark.parametrize(
    ("bias", "applies"),
    [(torch.tensor(0.5), False), (torch.randn(1, 256), False), (torch.randn(256), True)],
    ids=["0-d", "a row to broadcast", "one per weight row"],
)
def test_scalar_and_broadcast_biases(fused, threads, bias, applies) -> None:
    result = fused(linear_plus, torch.randn(1, 128), torch.randn(*SPLIT_WEIGHT), bias)
    assert result.applied(BADDBMM) if applies else result.refused()
    result.assert_close(**TOLERANCE)


def test_a_batched_input_is_split_as_its_rows(fused, threads) -> None:
    # nn.Linear over [batch, 1, features]: a view to one row, the product, a view back.
    result = fused(product, torch.randn(1, 1, 128), torch.randn(*SPLIT_WEIGHT))
    assert result.applied(BMM)
    result.assert_close(**TOLERANCE)


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64], ids=str
)
def test_other_dtypes_are_refused(fused, threads, dtype) -> None:
    x, w = torch.randn(1, 128), torch.randn(*SPLIT_WEIGHT)
    if not dtype.is_floating_point:
        x, w = torch.randint(-3, 4, x.shape), torch.randint(-3, 4, w.shape)
    result = fused(product, x.to(dtype), w.to(dtype))
    assert result.refused()
    result.assert_close()


def test_a_bias_cast_to_float32_first_is_split(fused, threads) -> None:
    bias = torch.randn(256, dtype=torch.float64)
    result = fused(lambda x, w, b: linear_plus(x, w, b.float()), torch.randn(1, 128),
                   torch.randn(*SPLIT_WEIGHT), bias)  # fmt: skip
    assert result.applied(BADDBMM)  # cast first: the bias the product sees is float32
    result.assert_close(**TOLERANCE)


@pytest.mark.parametrize(
    ("operand", "applies"), [("input", True), ("weight", False)], ids=["input", "weight"]
)
def test_non_contiguous_operands(fused, threads, operand, applies) -> None:
    x, w = torch.randn(1, 128), torch.randn(*SPLIT_WEIGHT)
    if operand == "input":
        x = torch.randn(128, 2)[:, :1].t()
    else:
        w = torch.randn(SPLIT_WEIGHT[0], 2 * SPLIT_WEIGHT[1])[:, ::2]
    assert not (x.is_contiguous() and w.is_contiguous())
    result = fused(product, x, w)
    assert result.applied(BMM) if applies else result.refused()
    result.assert_close(**TOLERANCE)


def test_a_host_where_the_split_does_not_pay_keeps_mm(traced, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(host_probes, "split_pays", lambda: False)
    with intra_op_threads(THREADS):
        counts = fused_counts(traced, torch.randn(1, 128), torch.randn(*SPLIT_WEIGHT))
    assert counts == {MM: 1, BMM: 0}


def test_the_host_probe_times_both_and_splits_only_with_a_clear_gain() -> None:
    result = host_probes.split_probe(2)
    assert result.threads == 2 and result.mm_ms > 0 and result.other_ms > 0
    assert result.pays == (result.mm_ms / result.other_ms >= host_probes.SPLIT_GAIN)
    assert host_probes.split_probe(2) is result  # measured once per process and thread count
    assert not host_probes.split_probe(1).pays  # one thread: nothing to split over
