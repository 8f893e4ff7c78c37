"""The built-in eager-attention pattern: attention written out becomes one fused kernel."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import npugraph_ex
from helpers import GraphRecorder, intra_op_threads, kernels_per_replay
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.remove_noop import remove_noop_ops

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
TOLERANCE = dict(atol=1e-5, rtol=1e-5)
"""Fused against written-out attention on unit-scale float32 values (measured: under 1e-6)."""


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, heads, length, dim = x.shape
    x = x[:, :, None, :, :].expand(batch, heads, n_rep, length, dim)
    return x.reshape(batch, heads * n_rep, length, dim)


@pytest.fixture
def one_thread() -> Iterator[None]:
    with intra_op_threads(1):
        yield


def eager_attention(q, k, v, mask, training=False):
    """Hugging Face's ``eager_attention_forward``, minus the module."""
    k, v = repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // v.shape[1])
    weights = torch.matmul(q, k.transpose(2, 3)) * 0.25
    if mask is not None:
        weights = weights + mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = F.dropout(weights, p=0.1, training=training)
    return torch.matmul(weights, v).transpose(1, 2).contiguous()


def inputs(heads: int = 4, kv_heads: int = 2, masked: bool = True):
    q, k, v = (
        torch.randn(1, heads, 6, 16),
        torch.randn(1, kv_heads, 6, 16),
        torch.randn(1, kv_heads, 6, 16),
    )
    mask = torch.triu(torch.full((6, 6), -1e9), 1)[None, None] if masked else None
    return q, k, v, mask


@pytest.mark.parametrize(
    ("heads", "kv_heads", "masked"),
    [(4, 2, True), (4, 2, False), (4, 4, True), (4, 4, False)],
    ids=["grouped, masked", "grouped", "plain, masked", "plain"],
)
def test_attention_written_out_becomes_one_kernel(traced, heads, kv_heads, masked) -> None:
    graph = traced(eager_attention, *inputs(heads, kv_heads, masked))
    assert graph.count(torch.ops.aten._softmax.default) == 1
    remove_noop_ops(graph.gm, graph.inputs, Config())  # it runs first: the float32 cast goes
    fuse_patterns(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts[str(FLASH)] == 1
    assert counts["aten._softmax.default"] == 0 and counts["aten.bmm.default"] == 0


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "no mask"])
def test_a_decode_step_runs_its_grouped_heads_as_rows_of_the_key_heads(traced, masked) -> None:
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)
    mask = torch.randn(2, 1, 1, 6) if masked else None
    graph = traced(eager_attention, q, k, v, mask)
    remove_noop_ops(graph.gm, graph.inputs, Config())
    fuse_patterns(graph.gm, graph.inputs, Config())
    (flash,) = [n for n in graph.gm.graph.nodes if n.target is FLASH]
    assert flash.args[0].meta["val"].shape == (2, 2, 2, 16)  # 2 key heads, 2 query rows each
    assert torch.allclose(
        graph.run(q, k, v, *([mask] if masked else []))[0],
        eager_attention(q, k, v, mask),
        **TOLERANCE,
    )


def biased_attention(q, k, v, bias, mask):
    """T5's attention where the padding mask is a tensor: a position bias, then the mask."""
    weights = torch.matmul(q, k.transpose(3, 2)) + bias + mask
    weights = F.softmax(weights.float(), dim=-1).type_as(weights)
    return torch.matmul(weights, v)


@torch.no_grad()
def test_a_position_bias_and_a_mask_become_one_mask_of_one_kernel(traced) -> None:
    q, k, v, mask = inputs(4, 4)
    bias = torch.randn(1, 4, 6, 6)
    graph = traced(biased_attention, q, k, v, bias, mask)
    remove_noop_ops(graph.gm, graph.inputs, Config())
    assert graph.op_counts()["aten.add.Tensor"] == 2
    fuse_patterns(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts[str(FLASH)] == 1 and counts["aten._softmax.default"] == 0
    assert counts["aten.add.Tensor"] == 1  # bias + mask, the fused kernel's one mask
    compiled = torch.compile(biased_attention, backend="npugraph_ex", fullgraph=True)
    expected = biased_attention(q, k, v, bias, mask)
    torch.testing.assert_close(compiled(q, k, v, bias, mask), expected, **TOLERANCE)


def test_attention_with_dropout_in_training_is_left_alone(traced) -> None:
    q, k, v, mask = inputs()
    graph = traced(lambda *a: eager_attention(*a, training=True), q, k, v, mask)
    remove_noop_ops(graph.gm, graph.inputs, Config())
    before = graph.op_counts()
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.op_counts()[str(FLASH)] == 0
    assert graph.op_counts()["aten._softmax.default"] == before["aten._softmax.default"]


@torch.no_grad()
def test_results_are_within_the_documented_tolerance() -> None:
    compiled = torch.compile(eager_attention, backend="npugraph_ex", fullgraph=True)
    for _ in range(3):
        args = inputs()
        torch.testing.assert_close(compiled(*args), eager_attention(*args), atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_a_qwen3_with_eager_attention_runs_fused_within_tolerance(
    tiny_qwen3_config, one_thread
) -> None:
    # One intra-op thread: the few-row product pattern, also in pattern_fusion_pass, stays out
    # of the kernel count.
    model = tiny_qwen3_config(attn_implementation="eager")
    kernels = {}
    for fused in (True, False):
        torch._dynamo.reset()
        npugraph_ex.reset_stats()  # the other graph may outlive the reset until collected
        step = torch.compile(
            lambda ids: model(input_ids=ids, use_cache=False).logits,
            backend="npugraph_ex",
            fullgraph=True,
            options={"pattern_fusion_pass": fused},
        )
        for seed in range(3):  # one shape: captured once, then replayed
            generator = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=generator)
            expected = model(input_ids=ids, use_cache=False).logits
            torch.testing.assert_close(step(ids), expected, atol=1e-5, rtol=0)
        kernels[fused] = kernels_per_replay()
    # Per layer: two bmm, softmax, scale, mask add and two repeat_kv copies become one kernel
    # and, six positions being few enough for the key heads' query rows, one copy comes in: the
    # mask's rows for each head of a group (the model copies the output itself, with
    # ``.contiguous()``, before it views it).
    assert kernels[False] - kernels[True] == 2 * 5


@torch.no_grad()
def test_a_growing_sequence_with_dynamic_shapes_decodes_the_same_tokens(tiny_qwen3_config) -> None:
    # With dynamic shapes the sizes in the pattern are symbolic, and the scale, a float the model
    # holds, is traced as a constant (npugraph_ex.model_floats), so the fused kernel takes it.
    model = tiny_qwen3_config(attn_implementation="eager")
    step = torch.compile(
        lambda ids: model(input_ids=ids, use_cache=False).logits,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=True,
    )
    ids = eager_ids = torch.randint(0, model.config.vocab_size, (1, 4))
    for _ in range(4):
        logits, expected = step(ids), model(input_ids=eager_ids, use_cache=False).logits
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], 1)
        eager_ids = torch.cat([eager_ids, expected[:, -1:].argmax(-1)], 1)
    assert torch.equal(ids, eager_ids)


def eager_attention_scaled_by(q, k, v, scale):  # noqa: ANN001, ANN201
    weights = F.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1, dtype=torch.float32)
    return torch.matmul(weights.to(q.dtype), v)


@torch.no_grad()
def test_a_scale_passed_in_as_an_argument_is_refused_not_fatal() -> None:
    # A float argument stays an input (a 0-d tensor, the value may change per call), which the
    # fused kernel cannot take as its scale: the match is refused, results stay exact.
    recorder = GraphRecorder()
    compiled = torch.compile(
        eager_attention_scaled_by,
        backend="npugraph_ex",
        dynamic=True,
        options={"post_grad_custom_post_pass": recorder},
    )
    q, k, v, _ = inputs(heads=4, kv_heads=4)
    for scale in (0.25, 0.5):
        assert torch.equal(compiled(q, k, v, scale), eager_attention_scaled_by(q, k, v, scale))
    counts = Counter(str(node.target) for node in recorder.only().nodes)
    assert counts["aten._softmax.default"] == 1 and counts[str(FLASH)] == 0


def test_both_spellings_of_the_key_transpose_match(traced) -> None:
    q, k, v, _ = inputs(heads=4, kv_heads=4)
    graph = traced(lambda *a: eager_attention_scaled_by(*a, 0.25), q, k, v)
    remove_noop_ops(graph.gm, graph.inputs, Config())
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.op_counts()[str(FLASH)] == 1


def attention_without_scale(q, k, v, mask):  # noqa: ANN001, ANN201
    weights = F.softmax(torch.matmul(q, k.transpose(2, 3)) + mask, dim=-1, dtype=torch.float32)
    return torch.matmul(weights.to(q.dtype), v)


def test_attention_without_a_scale_becomes_one_kernel(traced) -> None:
    graph = traced(attention_without_scale, *inputs(heads=4, kv_heads=4))
    remove_noop_ops(graph.gm, graph.inputs, Config())
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.op_counts()[str(FLASH)] == 1
    (fused,) = graph.gm.graph.find_nodes(op="call_function", target=FLASH)
    assert fused.kwargs["scale"] == 1.0


def hugging_face_model(name: str) -> torch.nn.Module:
    """One layer of a Hugging Face architecture with ``eager`` attention, random weights."""
    import transformers as hf

    eager = dict(attn_implementation="eager")
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, vocab_size=128, **eager)
    configs = {
        "gpt2": lambda: hf.GPT2LMHeadModel(
            hf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=128, n_positions=64, **eager)
        ),
        "llama": lambda: hf.LlamaForCausalLM(
            hf.LlamaConfig(**small, num_attention_heads=4, num_key_value_heads=2)
        ),
        "bert": lambda: hf.BertModel(hf.BertConfig(**small, num_attention_heads=2)),
        "opt": lambda: hf.OPTForCausalLM(
            hf.OPTConfig(**small, ffn_dim=64, num_attention_heads=2, word_embed_proj_dim=32)
        ),
        "t5": lambda: hf.T5EncoderModel(
            hf.T5Config(
                d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=128, **eager
            )
        ),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = configs[name]()
    assert model.config._attn_implementation == "eager"
    return model.eval()


@torch.no_grad()
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "opt", "t5"])
def test_hugging_face_eager_attention_is_fused_with_dynamic_shapes(name: str, batch: int) -> None:
    # gpt2 transposes the key with (-1, -2); llama repeats K/V heads; bert masks padding, not
    # the future; opt scales the query before the product; t5 adds a position bias, no scale.
    # A batch of 2 makes batch and length two symbols, and the products copy every operand
    # but llama's rotated query and key and repeated value.
    torch._dynamo.reset()
    model, recorder = hugging_face_model(name), GraphRecorder()
    compiled = torch.compile(
        model,
        backend="npugraph_ex",
        dynamic=True,
        options={"post_grad_custom_post_pass": recorder},
    )
    extra = {} if name in ("bert", "t5") else {"use_cache": False}
    for length in (5, 7):
        generator = torch.Generator().manual_seed(length)
        ids = torch.randint(1, 128, (batch, length), generator=generator)
        expected = model(input_ids=ids, **extra)[0]
        torch.testing.assert_close(compiled(input_ids=ids, **extra)[0], expected, **TOLERANCE)
    counts = Counter(str(node.target) for node in recorder.only().nodes)
    assert counts[str(FLASH)] == 1
    assert counts["aten._softmax.default"] == 0


def attention(q, k, v, mask, scale=0.25):  # noqa: ANN001, ANN201
    """Hugging Face's eager attention without grouped heads; ``mask`` of any kind."""
    weights = torch.matmul(q, k.transpose(2, 3)) * scale + mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


def qkv(dtype: torch.dtype = torch.float32, batch: int = 1, kv_batch: int | None = None):
    kv_batch = batch if kv_batch is None else kv_batch
    return (
        torch.randn(batch, 4, 6, 16, dtype=dtype),
        torch.randn(kv_batch, 4, 6, 16, dtype=dtype),
        torch.randn(kv_batch, 4, 6, 16, dtype=dtype),
    )


CAUSAL = torch.triu(torch.full((6, 6), -1e9), 1)


@pytest.mark.parametrize("mask", [1.0, 2], ids=["float", "int"])
def test_a_number_added_as_the_mask_is_refused(fused, mask) -> None:
    result = fused(lambda q, k, v: attention(q, k, v, mask), *qkv())
    assert result.refused()
    result.assert_close()


def test_a_scale_that_is_a_tensor_is_refused(fused) -> None:
    result = fused(attention, *qkv(), CAUSAL, torch.tensor(0.25))
    assert result.refused()
    result.assert_close()


@pytest.mark.parametrize(
    ("mask", "applies"),
    [
        (CAUSAL, True),
        (CAUSAL[None, None], True),
        (CAUSAL[None, None].expand(1, 4, 6, 6), True),
        (CAUSAL[:, :1], True),
        (torch.randn(2, 1, 4, 6, 6), False),  # grows the scores to 5-d
    ],
    ids=["2-d", "4-d", "expanded", "one column", "5-d"],
)
def test_broadcast_masks(fused, mask, applies) -> None:
    result = fused(attention, *qkv(), mask)
    assert result.applied(FLASH) if applies else result.refused()
    result.assert_close(**TOLERANCE)


def test_a_batch_the_products_broadcast_is_refused(fused) -> None:
    result = fused(attention, *qkv(batch=2, kv_batch=1), CAUSAL)
    assert result.refused()
    result.assert_close()


@pytest.mark.parametrize(
    ("dtype", "mask_dtype", "applies"),
    [
        (torch.float64, torch.float64, False),  # the pattern's re-trace holds float32 casts
        (torch.float16, torch.float16, False),  # softmax in float16: the kernel's is float32
        (torch.bfloat16, torch.bfloat16, False),  # (in float32 between casts it applies: below)
        (torch.float32, torch.float64, False),  # the add promotes the scores to float64
        (torch.float32, torch.bool, False),  # added as 0/1; the kernel would read "keep"
        (torch.float32, torch.int64, False),
    ],
    ids=str,
)
def test_other_dtypes(fused, dtype, mask_dtype, applies) -> None:
    mask = CAUSAL.to(mask_dtype) if mask_dtype.is_floating_point else CAUSAL.ne(0).to(mask_dtype)
    # Softmax in the input's dtype where that is not float32, as a float32 graph has it.
    fn = attention if dtype == torch.float32 else softmax_in_input_dtype
    result = fused(fn, *qkv(dtype), mask)
    assert result.applied(FLASH) if applies else result.refused()
    result.assert_close(**TOLERANCE)


def softmax_in_input_dtype(q, k, v, mask):  # noqa: ANN001, ANN201
    """Attention whose softmax runs in the input's dtype: no casts, as in a float32 graph."""
    weights = F.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask, dim=-1)
    return torch.matmul(weights, v)


def test_non_contiguous_inputs(fused) -> None:
    # As models lay them out: [batch, length, heads, dim] projections, transposed.
    q, k, v = (torch.randn(1, 6, 4, 16).transpose(1, 2) for _ in range(3))
    mask = torch.randn(6, 12)[:, ::2]
    assert not any(t.is_contiguous() for t in (q, k, v, mask))
    result = fused(attention, q, k, v, mask)
    assert result.applied(FLASH)
    result.assert_close(**TOLERANCE)


def laid_out(transposed: bool, batch: int = 2, heads: int = 4) -> torch.Tensor:
    """A [batch, heads, 6, 16] operand, contiguous or as a projection's output transposed."""
    if transposed:
        return torch.randn(batch, 6, heads, 16).transpose(1, 2)
    return torch.randn(batch, heads, 6, 16)


LAYOUTS = list(itertools.product((False, True), repeat=3))
"""Query, key and value each contiguous or transposed."""


@pytest.mark.parametrize(
    "layout", LAYOUTS, ids=["".join("T" if t else "c" for t in lay) for lay in LAYOUTS]
)
def test_a_batch_of_transposed_operands_is_fused_in_every_layout(fused, layout) -> None:
    # A product views a batch of more than one transposed operand as matrices only after a copy
    # (a clone the pattern traced from contiguous values does not hold).
    q, k, v = (laid_out(transposed) for transposed in layout)
    result = fused(attention, q, k, v, CAUSAL)
    assert result.before["aten.clone.default"] == sum(layout)
    # The kernel lays its output out like the query: a transposed query's output, the graph's
    # output here, is copied back into the contiguous layout the products gave it.
    assert result.applied(FLASH) and result.after["aten.clone.default"] == int(layout[0])
    result.assert_close(**TOLERANCE)
    assert [out.stride() for out in result.actual] == [out.stride() for out in result.expected]


def test_a_graph_whose_products_copy_an_operand_gets_the_patterns_that_hold_the_copy(
    traced, monkeypatch
) -> None:
    # As AOTAutograd hands it over (the copy's reshape spelled ``_unsafe_view``): the pass
    # registers the patterns of copied operands for the graph's dtype before it matches.
    import npugraph_ex.passes.fuse_patterns as pass_module

    registered: list[torch.dtype] = []
    monkeypatch.setattr(pass_module, "register_copied_operands_for", registered.append)
    graph = traced(attention, laid_out(True), laid_out(False), laid_out(False), CAUSAL)
    assert graph.count(torch.ops.aten._unsafe_view.default) == 1
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert registered == [torch.float32]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_grouped_attention_on_a_transposed_batch_is_fused(fused, dynamic) -> None:
    # Hugging Face's eager attention for models without rotary embeddings (the query is the
    # projection's output, transposed); dynamic: batch and length are two symbols, the heads
    # fixed, as a model's weights fix them.
    q, k, v = laid_out(True), laid_out(True, heads=2), laid_out(True, heads=2)
    mask = CAUSAL[None, None].clone()
    if dynamic:
        for tensor in (q, k, v):
            torch._dynamo.mark_dynamic(tensor, 0)
            torch._dynamo.mark_dynamic(tensor, 2)
        torch._dynamo.mark_dynamic(mask, 2)
        torch._dynamo.mark_dynamic(mask, 3)
    result = fused(eager_attention, q, k, v, mask)
    assert result.applied(FLASH) and result.after["aten._softmax.default"] == 0
    result.assert_close(**TOLERANCE)


HALF_TOLERANCE = {
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
"""Fused against written-out attention in half precision, unit-scale values: both round the
float32 softmax to the dtype once; the products' sums differ in order (measured: under 1e-3 in
float16, under 8e-3 in bfloat16)."""


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_half_precision_attention_with_a_float32_softmax_becomes_one_kernel(
    fused, dtype, masked
) -> None:
    q, k, v, mask = inputs(4, 2, masked=masked)
    half = [t.to(dtype) if t is not None else None for t in (q, k, v, mask)]
    result = fused(eager_attention, *half)
    assert result.before["aten._to_copy.default"] == 2  # the softmax's casts, kept in the graph
    assert result.applied(FLASH)
    assert result.after["aten._softmax.default"] == 0 and result.after["aten.bmm.default"] == 0
    assert result.after["aten._to_copy.default"] == 0
    result.assert_close(**HALF_TOLERANCE[dtype])


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_a_qwen3_in_half_precision_with_eager_attention_runs_fused(
    tiny_qwen3_config, dtype
) -> None:
    model = tiny_qwen3_config(attn_implementation="eager").to(dtype)
    recorder = GraphRecorder()
    options = {"post_grad_custom_post_pass": recorder}
    step = torch.compile(
        lambda ids: model(input_ids=ids, use_cache=False).logits,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=True,
        options=options,
    )
    for length in (6, 9):
        ids = torch.randint(
            0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length)
        )
        expected = model(input_ids=ids, use_cache=False).logits
        torch.testing.assert_close(step(ids), expected, **HALF_TOLERANCE[dtype])
    counts = Counter(str(n.target) for n in recorder.only().nodes)
    assert counts[str(FLASH)] == model.config.num_hidden_layers
    assert counts["aten._softmax.default"] == 0
