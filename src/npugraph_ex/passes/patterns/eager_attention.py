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
Applied where the kernel computes what the ops did (``fusable``): to float32 graphs, and to
float16 and bfloat16 ones whose softmax runs in float32 between two casts, as transformers
writes it (the fused kernels accumulate in float32 too); not to half-precision graphs whose
softmax runs in half precision, numbers or bool tensors added as a mask, masks of another dtype,
or products that broadcast the batch; and on devices whose platform lists the fused kernel
(``Platform.fused_kernels``: CPU, CUDA, NPU). The half-precision patterns are traced the first
time a graph with half-precision inputs reaches the pass (``register_for``).
Tolerance: the fused kernel sums in another order (max |diff| about 1e-7 for unit-scale
float32 values; within half precision's rounding of eager's float16 and bfloat16 results,
measured in the tests); dropout must be off (``training=False``), which is how the graph reaches
this pass in inference.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from npugraph_ex.passes.patterns.checks import (
    bound,
    bound_tensors,
    broadcasts_to,
    one_kind,
    same_shape,
)
from npugraph_ex.passes.patterns.gqa_attention import register_scaled_attention, repeat_kv
from npugraph_ex.passes.patterns.registry import add_replacement
from npugraph_ex.runtime.platform import SDPA, platform_for

HALF_PRECISION = (torch.float16, torch.bfloat16)
"""The dtypes with patterns of their own: traced in such a dtype, a pattern holds the softmax's
casts to float32 and back. Traced in float32 it has none, and in a half-precision graph it would
match a softmax computed in half precision, which the fused kernel computes in float32: each
pattern is therefore applied to graphs of the dtype it was traced in only (float64 graphs never
match: the re-trace of a pattern with their values holds the casts)."""


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


def fusable(match: Any, dtype: torch.dtype = torch.float32, terms: tuple[str, ...] = ()) -> bool:
    """What ``scaled_dot_product_attention`` computes is what the written-out ops did.

    Query, key and value are 4-d tensors of ``dtype`` (the patterns' own) on one device, of one
    batch size (the products would broadcast it, the kernel does not), key and value of one
    length and head count, the query heads a multiple of the key heads; each additive term the
    pattern takes (``terms``: ``mask``, ``bias``) is a tensor of the query's dtype and device (the
    add would promote to a float64 mask's dtype, or add a bool one as 0 and 1, where the kernel
    reads a bool mask as "keep") that broadcasts to the scores' shape without growing it; and the
    platform of their device lists the fused kernel.

    A term missing from the match is a number the re-check matched as a literal (torch 2.11's
    matcher leaves it out of the re-check's bindings, later ones fill it in from the first
    match): refused like any other number, which the kernel cannot take as its mask.
    """
    tensors = bound_tensors(match, "q", "k", "v")
    if tensors is None:
        return False
    q, k, v = tensors
    if not (one_kind([q, k, v], (dtype,)) and q.dim() == k.dim() == v.dim() == 4):
        return False
    if not (
        same_shape(q.shape[:1], k.shape[:1])
        and same_shape(k.shape[:3], v.shape[:3])
        and same_shape(q.shape[3:], k.shape[3:])
        and statically_known_true(q.shape[1] % k.shape[1] == 0)
    ):
        return False
    scores = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    for name in terms:
        term = bound(match, name)
        if not (
            isinstance(term, torch.Tensor)
            and one_kind([q, term])
            and broadcasts_to(term.shape, scores)
        ):
            return False
    return SDPA in platform_for(q.device.type).fused_kernels()


def check_for(search: Any, dtype: torch.dtype) -> Any:
    """``fusable`` for the pattern ``search``: of its dtype, with the additive terms it takes."""
    parameters = inspect.signature(search).parameters
    terms = tuple(name for name in ("bias", "mask") if name in parameters)
    return functools.partial(fusable, dtype=dtype, terms=terms)


def register(pass_dict: Any, dtype: torch.dtype = torch.float32) -> None:
    """The patterns traced in ``dtype`` (float32, or one of ``HALF_PRECISION``)."""

    def example(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).to(dtype)

    q, grouped_k, k = example(1, 4, 3, 8), example(1, 2, 5, 8), example(1, 4, 5, 8)
    mask = example(1, 1, 3, 5)
    for search, replace, kv in (
        (grouped_masked, fused_masked, grouped_k),
        (grouped, fused, grouped_k),
        (plain_masked, fused_masked, k),
        (plain, fused, k),
    ):
        inputs = [q, kv, kv.clone(), mask] if replace is fused_masked else [q, kv, kv.clone()]
        register_scaled_attention(
            pass_dict, search, replace, inputs, check=check_for(search, dtype)
        )
    for search, replace, kv in (
        (grouped_masked_unscaled, fused_masked_unscaled, grouped_k),
        (grouped_unscaled, fused_unscaled, grouped_k),
        (plain_masked_unscaled, fused_masked_unscaled, k),
        (plain_unscaled, fused_unscaled, k),
    ):
        masked = replace is fused_masked_unscaled
        add_replacement(
            pass_dict,
            search,
            replace,
            [q, kv, kv.clone(), *([mask] if masked else [])],
            extra_check=check_for(search, dtype),
        )
    bias = example(1, 4, 3, 5)
    add_replacement(
        pass_dict,
        plain_biased_masked_unscaled,
        fused_biased_masked_unscaled,
        [q, k, k.clone(), bias, mask],
        extra_check=check_for(plain_biased_masked_unscaled, dtype),
    )
