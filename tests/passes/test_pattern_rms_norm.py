"""The built-in RMSNorm pattern: the written-out norm becomes ``_fused_rms_norm`` on devices
with a fused kernel, and stays as it is elsewhere.

This CPU build of PyTorch has no fused kernel (``_fused_rms_norm`` is composite on CPU), so the
cases where the pattern applies register one for CPU through ``torch.library`` while they run: a
real kernel in the dispatcher, computing in float32 and rounding once, as CUDA's does.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import npugraph_ex
from helpers import GraphRecorder, kernels_per_replay
from models import TINY_QWEN3, make_tiny_qwen3
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.patterns.rms_norm import has_fused_kernel
from npugraph_ex.passes.remove_noop import remove_noop_ops

aten = torch.ops.aten
FUSED = aten._fused_rms_norm.default
WRITTEN_OUT = ("aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.rsqrt.default")
HIDDEN = 16


def fused_rms_norm_cpu(x, normalized_shape, weight, eps):  # noqa: ANN001, ANN201
    dims = list(range(-len(normalized_shape), 0))
    h = x.to(torch.float32)
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    rstd = torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)
    out = h * rstd if weight is None else h * rstd * weight.to(torch.float32)
    return out.to(x.dtype), rstd


@contextlib.contextmanager
def cpu_kernel_registered() -> Iterator[None]:
    """A fused ``_fused_rms_norm`` kernel for CPU, inside the ``with`` block."""
    assert not has_fused_kernel(torch.device("cpu")), "this PyTorch has a CPU kernel of its own"
    library = torch.library.Library("aten", "IMPL")
    library.impl("_fused_rms_norm", fused_rms_norm_cpu, "CPU")
    # The Python dispatcher (which tracing goes through) keeps each op's resolved kernels: one
    # resolved while the op had only its composite form would still decompose it.
    FUSED._dispatch_cache.clear()
    try:
        assert has_fused_kernel(torch.device("cpu"))
        yield
    finally:
        library._destroy()
        FUSED._dispatch_cache.clear()


@pytest.fixture
def cpu_fused_kernel() -> Iterator[None]:
    with cpu_kernel_registered():
        yield


class RMSNorm(nn.Module):
    """As Hugging Face writes it (``Qwen3RMSNorm``), with the weight on either side, its shape
    and dtype, and the reduced dimension open to change for the negative cases."""

    def __init__(self, weight: torch.Tensor, *, weight_first: bool = True, dim: int = -1):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.weight_first = weight_first
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(self.dim, keepdim=True) + 1e-6)
        h = h.to(x.dtype)
        return self.weight * h if self.weight_first else h * self.weight


def norm_and_input(dtype: torch.dtype, **options) -> tuple[RMSNorm, torch.Tensor]:
    weight = torch.rand(HIDDEN, dtype=dtype) + 0.5
    return RMSNorm(weight, **options).eval(), torch.randn(3, 5, HIDDEN, dtype=dtype)


def fused_graph(traced, module: nn.Module, x: torch.Tensor):
    graph = traced(module, x)
    remove_noop_ops(graph.gm, graph.inputs, Config())
    fuse_patterns(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    return graph


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_first", [True, False])
def test_the_written_out_norm_becomes_one_kernel(
    traced, cpu_fused_kernel, dtype, weight_first
) -> None:
    norm, x = norm_and_input(dtype, weight_first=weight_first)
    graph = fused_graph(traced, norm, x)
    counts = graph.op_counts()
    assert graph.count(FUSED) == 1
    assert sum(counts[name] for name in (*WRITTEN_OUT, "aten.mul.Tensor")) == 0
    assert counts["aten._to_copy.default"] == 0
    (node,) = [n for n in graph.gm.graph.nodes if n.target is FUSED]
    assert node.args[1] == [HIDDEN] and node.args[3] == 1e-6


def test_it_is_left_alone_where_the_device_has_no_fused_kernel(traced) -> None:
    norm, x = norm_and_input(torch.float32)
    graph = traced(norm, x)
    remove_noop_ops(graph.gm, graph.inputs, Config())
    before = graph.op_counts()
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before and graph.count(FUSED) == 0


@pytest.mark.parametrize(
    "case",
    ["weight broadcast over more dims", "weight of another dtype", "not the last dim"],
)
def test_what_the_kernel_would_compute_differently_is_not_matched(
    traced, cpu_fused_kernel, case
) -> None:
    norm, x = norm_and_input(torch.float32)
    if case == "weight broadcast over more dims":
        norm = RMSNorm(torch.rand(1, 1, HIDDEN) + 0.5)
    elif case == "weight of another dtype":
        norm, x = RMSNorm(torch.rand(HIDDEN) + 0.5), x.to(torch.bfloat16)
    else:
        norm = RMSNorm(torch.rand(5, 1) + 0.5, dim=1)
    graph = fused_graph(traced, norm, x)
    assert graph.count(FUSED) == 0
    assert all(graph.op_counts()[name] == 1 for name in WRITTEN_OUT)


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [(torch.float32, dict(rtol=1e-6, atol=1e-6)), (torch.bfloat16, dict(rtol=2**-7, atol=0))],
)
@torch.no_grad()
def test_replays_are_within_the_documented_tolerance(cpu_fused_kernel, dtype, tolerance) -> None:
    norm, _ = norm_and_input(dtype)
    compiled = torch.compile(norm, backend="npugraph_ex", fullgraph=True)
    for _ in range(3):
        x = torch.randn(3, 5, HIDDEN, dtype=dtype) * 4
        torch.testing.assert_close(compiled(x), norm(x), **tolerance)


def qwen3_kernels_and_logits(ids: torch.Tensor, dynamic: bool) -> tuple[int, torch.Tensor]:
    """Kernels the tiny Qwen3's captured forward replays, and its logits."""
    torch._dynamo.reset()
    npugraph_ex.reset_stats()
    model = make_tiny_qwen3()
    compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True, dynamic=dynamic)
    logits = compiled(input_ids=ids).logits
    return kernels_per_replay(), logits


@torch.no_grad()
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_every_norm_of_a_qwen3_model_is_fused(dynamic: bool) -> None:
    # dynamic=True: Dynamo would pass each norm's eps as a tensor input, which the fused kernel
    # cannot take; the backend has them traced as constants (npugraph_ex.model_floats).
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    written_out, _ = qwen3_kernels_and_logits(ids, dynamic)
    with cpu_kernel_registered():
        fused, logits = qwen3_kernels_and_logits(ids, dynamic)
    # Per layer: input, post-attention, query and key norms; then the final norm. Six kernels
    # each (float32: no casts) become one.
    norms = 4 * TINY_QWEN3["num_hidden_layers"] + 1
    assert written_out - fused == 5 * norms
    expected = make_tiny_qwen3()(input_ids=ids).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def hugging_face_model(name: str) -> nn.Module:
    import transformers as hf

    small = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    configs = {
        # Gemma scales by (1 + weight), in float32, before the cast back.
        "gemma": lambda: hf.GemmaForCausalLM(hf.GemmaConfig(**small, head_dim=8)),
        # OLMo-2 normalises after attention and MLP, and the full query and key projections.
        "olmo2": lambda: hf.Olmo2ForCausalLM(hf.Olmo2Config(**small)),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return configs[name]().eval()


@torch.no_grad()
@pytest.mark.parametrize(("name", "norms"), [("gemma", 3), ("olmo2", 5)])
def test_other_hugging_face_norms_are_fused(cpu_fused_kernel, name: str, norms: int) -> None:
    torch._dynamo.reset()
    model, recorder = hugging_face_model(name), GraphRecorder()
    compiled = torch.compile(
        model, backend="npugraph_ex", dynamic=True, options={"post_grad_custom_post_pass": recorder}
    )
    ids = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    logits = compiled(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(logits, model(input_ids=ids, use_cache=False).logits)
    nodes = recorder.only().nodes
    assert sum(node.target is FUSED for node in nodes) == norms
    assert not any(node.target is aten.rsqrt.default for node in nodes)


def rms_norm(x, w, *, cast=True):  # noqa: ANN001, ANN201
    """The written-out norm as a function of its input and weight (a tensor or a number)."""
    h = x.to(torch.float32) if cast else x
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * (h.to(x.dtype) if cast else h)


LOW_PRECISION_ULP = dict(rtol=2**-7, atol=2**-7)
"""One unit in the last place of bfloat16 (coarser than float16's) for unit-scale outputs."""


@pytest.mark.parametrize("weight", [2.0, 3], ids=["float", "int"])
def test_a_weight_that_is_a_number_is_refused(fused, cpu_fused_kernel, weight) -> None:
    result = fused(lambda x: rms_norm(x, weight), torch.randn(3, HIDDEN))
    assert result.refused()
    result.assert_close()


def test_a_zero_dim_weight_is_refused(fused, cpu_fused_kernel) -> None:
    result = fused(rms_norm, torch.randn(3, HIDDEN), torch.tensor(2.0))
    assert result.refused()
    result.assert_close()


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "applies"),
    [((3, 5, HIDDEN), (HIDDEN,), True), ((HIDDEN,), (HIDDEN,), True), ((3, HIDDEN), (1,), False)],
    ids=["batched input", "1-d input", "weight of one element"],
)
def test_broadcast_weights(fused, cpu_fused_kernel, x_shape, w_shape, applies) -> None:
    result = fused(rms_norm, torch.randn(x_shape), torch.rand(w_shape) + 0.5)
    assert result.applied(FUSED) if applies else result.refused()
    result.assert_close(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("dtype", "cast", "applies"),
    [
        (torch.float64, False, False),  # the float32 pattern's re-trace holds casts
        (torch.float16, True, True),
        (torch.bfloat16, True, True),
        (torch.float16, False, False),  # computed in float16; the kernel's is float32
        (torch.bfloat16, False, False),
    ],
    ids=["float64", "float16", "bfloat16", "float16 uncast", "bfloat16 uncast"],
)
def test_other_dtypes(fused, cpu_fused_kernel, dtype, cast, applies) -> None:
    x, w = torch.randn(3, HIDDEN, dtype=dtype), torch.rand(HIDDEN, dtype=dtype) + 0.5
    result = fused(functools.partial(rms_norm, cast=cast), x, w)
    assert result.applied(FUSED) if applies else result.refused()
    result.assert_close(**(LOW_PRECISION_ULP if dtype in (torch.float16, torch.bfloat16) else {}))


def test_an_integer_input_is_refused(fused, cpu_fused_kernel) -> None:
    x = torch.randint(-4, 5, (3, HIDDEN))
    result = fused(rms_norm, x, torch.randint(1, 3, (HIDDEN,)))
    assert result.refused()
    result.assert_close()


def test_non_contiguous_inputs(fused, cpu_fused_kernel) -> None:
    x, w = torch.randn(HIDDEN, 3).t(), (torch.rand(2 * HIDDEN) + 0.5)[::2]
    assert not (x.is_contiguous() or w.is_contiguous())
    result = fused(rms_norm, x, w)
    assert result.applied(FUSED)
    result.assert_close(rtol=1e-6, atol=1e-6)
