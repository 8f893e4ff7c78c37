"""The built-in eager-attention pattern: attention written out becomes one fused kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import kernels_per_replay
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.remove_noop import remove_noop_ops

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, heads, length, dim = x.shape
    x = x[:, :, None, :, :].expand(batch, heads, n_rep, length, dim)
    return x.reshape(batch, heads * n_rep, length, dim)


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
def test_a_qwen3_with_eager_attention_runs_fused_within_tolerance(tiny_qwen3_config) -> None:
    model = tiny_qwen3_config(attn_implementation="eager")
    kernels = {}
    for fused in (True, False):
        torch._dynamo.reset()
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
    # Per layer: two bmm, softmax, scale, mask add and two repeat_kv copies become one kernel.
    assert kernels[False] - kernels[True] == 2 * 6


@torch.no_grad()
def test_a_growing_sequence_with_dynamic_shapes_decodes_the_same_tokens(tiny_qwen3_config) -> None:
    # With dynamic shapes the graph scales the scores by a 0-d tensor, which the fused kernel
    # cannot take as its scale: the pattern must refuse that match, not fail the compile.
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
