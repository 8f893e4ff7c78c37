"""Attention written out, as Hugging Face's ``eager`` implementation does, as one fused kernel.

    before: %k4, %v4 = repeat_kv(%k), repeat_kv(%v)
            %w = softmax(matmul(%q, %k4.transpose(2, 3)) * s + %mask, -1, float32).to(%q.dtype)
            %o = matmul(%w, %v4)
    after:  %o = scaled_dot_product_attention(%q, %k, %v, attn_mask=%mask, scale=s, enable_gqa)

The scores never exist as a tensor and K/V are not copied per query head. Matched with and
without the additive mask, with and without repeated heads (``num_key_value_groups`` of 1), and
without the scale (``scale=1``): models that scale the query first (OPT) or not at all (T5), and
a ``* 1.0`` that ``remove_noop_ops`` has already dropped. Two additive terms (T5's position bias,
then the padding mask transformers adds under torch 2.11 and skips under 2.13) become one mask,
their sum.
Tolerance: the fused kernel sums in another order (max |diff| about 1e-7 for unit-scale
float32 values, measured against eager in the tests); dropout must be off (``training=False``),
which is how the graph reaches this pass in inference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from npugraph_ex.passes.patterns.gqa_attention import register_scaled_attention, repeat_kv


def weights(q, k, scale=None, mask=None, bias=None):  # noqa: ANN001, ANN201
    scores = torch.matmul(q, k.transpose(2, 3))
    if scale is not None:
        scores = scores * scale
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores + mask
    return F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)


def repeated(q, k):  # noqa: ANN001, ANN201
    return repeat_kv(k, q.shape[1] // k.shape[1])


def grouped_masked(q, k, v, mask, scale):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, repeated(q, k), scale, mask), repeated(q, v))


def grouped(q, k, v, scale):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, repeated(q, k), scale), repeated(q, v))


def plain_masked(q, k, v, mask, scale):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, k, scale, mask), v)


def plain(q, k, v, scale):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, k, scale), v)


def grouped_masked_unscaled(q, k, v, mask):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, repeated(q, k), mask=mask), repeated(q, v))


def grouped_unscaled(q, k, v):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, repeated(q, k)), repeated(q, v))


def plain_masked_unscaled(q, k, v, mask):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, k, mask=mask), v)


def plain_unscaled(q, k, v):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, k), v)


def plain_biased_masked_unscaled(q, k, v, bias, mask):  # noqa: ANN001, ANN201
    return torch.matmul(weights(q, k, mask=mask, bias=bias), v)


def fused_masked(q, k, v, mask, scale):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def fused(q, k, v, scale):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)


def fused_masked_unscaled(q, k, v, mask):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0, enable_gqa=True)


def fused_unscaled(q, k, v):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(q, k, v, scale=1.0, enable_gqa=True)


def fused_biased_masked_unscaled(q, k, v, bias, mask):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias + mask, scale=1.0, enable_gqa=True
    )


def register() -> None:
    from npugraph_ex.passes.patterns import register_replacement

    q, grouped_k, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 4, 5, 8)
    mask = torch.randn(1, 1, 3, 5)
    for search, replace, kv in (
        (grouped_masked, fused_masked, grouped_k),
        (grouped, fused, grouped_k),
        (plain_masked, fused_masked, k),
        (plain, fused, k),
    ):
        inputs = [q, kv, kv.clone(), mask] if replace is fused_masked else [q, kv, kv.clone()]
        register_scaled_attention(search, replace, inputs)
    for search, replace, kv in (
        (grouped_masked_unscaled, fused_masked_unscaled, grouped_k),
        (grouped_unscaled, fused_unscaled, grouped_k),
        (plain_masked_unscaled, fused_masked_unscaled, k),
        (plain_unscaled, fused_unscaled, k),
    ):
        masked = replace is fused_masked_unscaled
        register_replacement(search, replace, [q, kv, kv.clone(), *([mask] if masked else [])])
    bias = torch.randn(1, 4, 3, 5)
    register_replacement(
        plain_biased_masked_unscaled, fused_biased_masked_unscaled, [q, k, k.clone(), bias, mask]
    )
