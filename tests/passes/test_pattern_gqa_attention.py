"""The built-in grouped-query attention pattern: repeated K/V heads read in place by the kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.runtime.platform import platform_for

aten = torch.ops.aten
FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """As Hugging Face models write it."""
    batch, heads, length, dim = x.shape
    x = x[:, :, None, :, :].expand(batch, heads, n_rep, length, dim)
    return x.reshape(batch, heads * n_rep, length, dim)


def masked_attention(q, k, v, mask):
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask, scale=0.3
    )


def causal_attention(q, k, v):
    return F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), is_causal=True)


def tiled_heads(q, k, v, mask):
    # k.repeat tiles heads (0, 1, 0, 1, ...), not (0, 0, 0, 0, 1, ...): grouping would differ.
    return F.scaled_dot_product_attention(
        q, k.repeat(1, 4, 1, 1), v.repeat(1, 4, 1, 1), attn_mask=mask, scale=0.3
    )


def masked_inputs():
    """More query positions than the rows form takes: the attention reads the heads in place."""
    return (
        torch.randn(2, 8, 20, 16),
        torch.randn(2, 2, 7, 16),
        torch.randn(2, 2, 7, 16),
        torch.randn(2, 1, 20, 7),
    )


def test_repeated_heads_are_read_in_place(traced) -> None:
    graph = traced(masked_attention, *masked_inputs())
    assert graph.count(aten.clone.default) == 2 and graph.count(FLASH) == 1
    fuse_patterns(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    assert graph.count(aten.clone.default) == 0 and graph.count(aten.expand.default) == 0
    assert graph.count(FLASH) == 1
    (flash,) = [n for n in graph.gm.graph.nodes if n.target is FLASH]
    assert flash.kwargs["scale"] == 0.3
    assert [fake.shape[1] for fake in (a.meta["val"] for a in flash.args[1:3])] == [2, 2]


def test_the_causal_form_is_fused_too(traced) -> None:
    q, k, v = torch.randn(1, 8, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    graph = traced(causal_attention, q, k, v)
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.count(aten.clone.default) == 0 and graph.count(FLASH) == 1


def test_tiled_heads_are_not_mistaken_for_grouped_ones(traced) -> None:
    graph = traced(tiled_heads, *masked_inputs())
    before = graph.op_counts()
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


@torch.no_grad()
def test_replays_are_bit_identical_to_eager() -> None:
    for fn, inputs in ((masked_attention, masked_inputs()), (tiled_heads, masked_inputs())):
        compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True)
        for _ in range(2):
            fresh = [torch.randn_like(t) for t in inputs]
            assert torch.equal(compiled(*fresh), fn(*fresh))


def attention_scaled(q, k, v, mask, scale=None):  # noqa: ANN001, ANN201
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask, scale=scale
    )


@pytest.mark.parametrize("scale", [None, 0.3, 1], ids=["default", "float", "int"])
def test_scales(fused, scale) -> None:
    result = fused(lambda q, k, v, m: attention_scaled(q, k, v, m, scale), *masked_inputs())
    assert result.after[str(aten.clone.default)] == 0 < result.before[str(aten.clone.default)]
    result.assert_close()


@pytest.mark.parametrize(
    "mask_shape", [(20, 7), (2, 1, 20, 7), (1, 1, 1, 7), (2, 8, 20, 7)], ids=str
)
def test_broadcast_masks(fused, mask_shape) -> None:
    q, k, v, _ = masked_inputs()
    result = fused(masked_attention, q, k, v, torch.randn(mask_shape))
    assert result.after[str(aten.clone.default)] == 0 < result.before[str(aten.clone.default)]
    result.assert_close()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_other_dtypes(fused, dtype) -> None:
    result = fused(masked_attention, *(t.to(dtype) for t in masked_inputs()))
    assert result.after[str(aten.clone.default)] == 0 < result.before[str(aten.clone.default)]
    result.assert_close()


def test_a_bool_mask(fused) -> None:
    q, k, v, mask = masked_inputs()
    result = fused(masked_attention, q, k, v, mask > -1)
    assert result.after[str(aten.clone.default)] == 0 < result.before[str(aten.clone.default)]
    result.assert_close()


def test_non_contiguous_inputs(fused) -> None:
    # As models lay them out: [batch, length, heads, dim] projections, transposed.
    q = torch.randn(2, 20, 8, 16).transpose(1, 2)
    k, v = (torch.randn(2, 7, 2, 16).transpose(1, 2) for _ in range(2))
    mask = torch.randn(2, 1, 7, 20).transpose(2, 3)
    result = fused(masked_attention, q, k, v, mask)
    assert result.after[str(aten.clone.default)] == 0 < result.before[str(aten.clone.default)]
    result.assert_close()


def test_key_and_value_of_other_head_counts_are_refused(fused) -> None:
    # Both repeated to 8 heads, from 2 and from 4: enable_gqa needs one head count for both.
    def uneven(q, k, v, mask):  # noqa: ANN001, ANN202
        return F.scaled_dot_product_attention(
            q, repeat_kv(k, 4), repeat_kv(v, 2), attn_mask=mask, scale=0.3
        )

    q, k, _, mask = masked_inputs()
    result = fused(uneven, q, k, torch.randn(2, 4, 7, 16), mask)
    assert result.refused()
    result.assert_close()


def one_token_inputs(dtype: torch.dtype = torch.float32, mask_heads: int = 1) -> tuple:
    """A decode step's attention: one query position, 8 heads on 2 key heads, 7 positions."""
    shapes = ((2, 8, 1, 16), (2, 2, 7, 16), (2, 2, 7, 16), (2, mask_heads, 1, 7))
    return tuple(torch.randn(shape, dtype=dtype) for shape in shapes)


def attention_rows(graph) -> list[tuple[int, int]]:  # noqa: ANN001
    """(heads, rows) of the query of each attention kernel of ``graph``."""
    flashes = [n for n in graph.gm.graph.nodes if n.target is FLASH]
    return [tuple(n.args[0].meta["val"].shape[1:3]) for n in flashes]


def test_one_query_position_runs_its_grouped_heads_as_rows_of_the_key_heads(traced) -> None:
    graph = traced(masked_attention, *one_token_inputs())
    assert attention_rows(graph) == [(8, 1)]
    fuse_patterns(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    assert graph.count(aten.clone.default) == 0 and attention_rows(graph) == [(2, 4)]


def test_a_mask_of_its_own_per_head_keeps_the_grouped_kernel(traced) -> None:
    graph = traced(masked_attention, *one_token_inputs(mask_heads=8))
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.count(aten.clone.default) == 0 and attention_rows(graph) == [(8, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@torch.no_grad()
def test_one_token_replays_equal_the_grouped_rows_transformers_runs_eagerly(dtype) -> None:  # noqa: ANN001
    def as_rows(q, k, v, mask):  # noqa: ANN001, ANN202
        rows = F.scaled_dot_product_attention(
            q.reshape(2, 2, 4, 16), k, v, attn_mask=mask, scale=0.3
        )
        return rows.reshape(2, 8, 1, 16)

    compiled = torch.compile(masked_attention, backend="npugraph_ex", fullgraph=True)
    for _ in range(2):
        inputs = one_token_inputs(dtype)
        assert torch.equal(compiled(*inputs), as_rows(*inputs))
        close = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
        torch.testing.assert_close(compiled(*inputs), masked_attention(*inputs), **close)


def shared_heads_attention(q, k, v, mask=None):  # noqa: ANN001, ANN201
    """Grouped heads as ``enable_gqa`` reads them in place, no repeated heads in the graph."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)


@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "masked"])
def test_one_token_attention_on_shared_heads_runs_as_rows_of_the_key_heads(traced, masked) -> None:  # noqa: ANN001
    q, k, v, mask = one_token_inputs()
    args = (q, k, v, mask) if masked else (q, k, v)
    graph = traced(shared_heads_attention, *args)
    assert attention_rows(graph) == [(8, 1)]
    fuse_patterns(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    assert attention_rows(graph) == [(2, 4)]
    (flash,) = [n for n in graph.gm.graph.nodes if n.target is FLASH]
    assert flash.kwargs["scale"] == 0.3
    torch.testing.assert_close(graph.run(*args)[0], shared_heads_attention(*args))


@pytest.mark.parametrize(
    ("q_shape", "mask_heads"),
    [((2, 8, 17, 16), 1), ((2, 8, 1, 16), 8), ((2, 2, 1, 16), 1)],
    ids=["17 query positions", "a mask per head", "one head per key head"],
)
def test_shared_heads_the_rows_form_cannot_take_keep_their_kernel(
    traced, q_shape, mask_heads
) -> None:  # noqa: ANN001
    k, v = torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    mask = torch.randn(2, mask_heads, q_shape[2], 7)
    graph = traced(shared_heads_attention, torch.randn(q_shape), k, v, mask)
    before = graph.op_counts()
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


@torch.no_grad()
def test_transformers_sdpa_decode_without_a_mask_runs_as_rows_of_the_key_heads(traced) -> None:  # noqa: ANN001
    # Under torch.compile, transformers' sdpa attention passes enable_gqa=True when there is no
    # mask (a decode step with no padding); eager runs the same call.
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 4, True

    def attend(q, k, v):  # noqa: ANN001, ANN202
        return sdpa_attention_forward(module, q, k, v, None, scaling=0.25)[0]

    q, k, v, _ = one_token_inputs(torch.bfloat16)
    graph = traced(attend, q, k, v)
    assert attention_rows(graph) == [(8, 1)]
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert attention_rows(graph) == [(2, 4)]
    compiled = torch.compile(attend, backend="npugraph_ex", fullgraph=True)
    for _ in range(2):
        q, k, v, _ = one_token_inputs(torch.bfloat16)
        torch.testing.assert_close(compiled(q, k, v), attend(q, k, v), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "search", [masked_attention, shared_heads_attention], ids=["repeated", "shared"]
)
@pytest.mark.parametrize("mask_rows", [4, 1], ids=["a mask row per position", "one mask row"])
def test_a_few_query_positions_run_as_rows_of_the_key_heads(traced, search, mask_rows) -> None:  # noqa: ANN001
    # Four tokens verified at once (speculative decoding), laid out as models lay them out.
    q = torch.randn(2, 4, 8, 16).transpose(1, 2)
    k, v = torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    mask = torch.randn(2, 1, mask_rows, 7)

    def attend(q, k, v, mask):  # noqa: ANN001, ANN202
        # The output viewed as models view it: laid out as the query, or the view fails.
        return search(q, k, v, mask).transpose(1, 2).view(2, 4, -1)

    graph = traced(attend, q, k, v, mask)
    fuse_patterns(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    assert graph.count(aten.expand.default) == (1 if mask_rows > 1 else 0)  # the mask's rows
    assert attention_rows(graph) == [(2, 16)]
    torch.testing.assert_close(graph.run(q, k, v, mask)[0], attend(q, k, v, mask))


@pytest.mark.parametrize(
    ("most", "positions", "rows"),
    [(0, 1, [(8, 1)]), (2, 2, [(2, 8)]), (2, 3, [(8, 3)])],
    ids=["none on the device", "as many as it runs", "one more"],
)
def test_the_device_platform_says_how_many_positions_run_as_rows(
    traced, monkeypatch, most, positions, rows
) -> None:  # noqa: ANN001
    monkeypatch.setattr(
        type(platform_for("cpu")), "grouped_rows_max_positions", lambda platform: most
    )
    q, k, v = torch.randn(2, 8, positions, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    mask = torch.randn(2, 1, positions, 7)
    graph = traced(masked_attention, q, k, v, mask, dynamic=False)
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert attention_rows(graph) == rows
    (flash,) = [n for n in graph.gm.graph.nodes if n.target is FLASH]
    assert flash.args[1].meta["val"].shape[1] == 2  # the key heads, read in place
    torch.testing.assert_close(graph.run(q, k, v, mask)[0], masked_attention(q, k, v, mask))
