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
their sum. One query position (a decode step) with a mask the same for every head runs as the key
heads' query rows instead of ``enable_gqa`` (``gqa_attention.grouped_attention``).
Applied where the kernel computes what the ops did (``fusable``): to float32 graphs, and to
float16 and bfloat16 ones whose softmax runs in float32 between two casts, as transformers
writes it (the fused kernels accumulate in float32 too); not to half-precision graphs whose
softmax runs in half precision, numbers or bool tensors added as a mask, masks of another dtype,
or products that broadcast the batch; and on devices whose platform lists the fused kernel
(``Platform.fused_kernels``: CPU, CUDA, NPU). The half-precision patterns are traced the first
time a graph with half-precision inputs reaches the pass (``register_for``); those whose products
copy a transposed batch of query, key or value first (``layouts``), the first time a graph with
such a copy does (``register_copied_operands_for``).
Tolerance: the fused kernel sums in another order (max |diff| about 1e-7 for unit-scale
float32 values; within half precision's rounding of eager's float16 and bfloat16 results,
measured in the tests); dropout must be off (``training=False``), which is how the graph reaches
this pass in inference.
"""

from __future__ import annotations

import functools
import inspect
import itertools
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
from npugraph_ex.passes.patterns.gqa_attention import (
    grouped_attention,
    register_scaled_attention,
    repeat_kv,
)
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
    return grouped_attention(q, k, v, mask, scale)


def fused(q, k, v, scale):  # noqa: ANN001, ANN201
    return grouped_attention(q, k, v, scale=scale)


def fused_masked_unscaled(q, k, v, mask):  # noqa: ANN001, ANN201
    return grouped_attention(q, k, v, mask, scale=1.0)


def fused_unscaled(q, k, v):  # noqa: ANN001, ANN201
    return grouped_attention(q, k, v, scale=1.0)


def fused_biased_masked_unscaled(q, k, v, bias, mask):  # noqa: ANN001, ANN201
    return grouped_attention(q, k, v, bias + mask, scale=1.0)


def fusable(match: Any, dtype: torch.dtype = torch.float32, terms: tuple[str, ...] = ()) -> bool:
    """What ``scaled_dot_product_attention`` computes is what the written-out ops did.

    Query, key and value are 4-d tensors of ``dtype`` (the patterns' own) on one device, of one
    batch size (the products would broadcast it, the kernel does not), key and value of one
    length and head count, the query heads a multiple of the key heads; each additive term the
    pattern takes (``terms``: ``mask``, ``bias``) is a tensor of the query's dtype and device (the
    add would promote to a float64 mask's dtype, or add a bool one as 0 and 1, where the kernel
    reads a bool mask as "keep") that broadcasts to the scores' shape without growing it; and the
    platform of their device lists the fused kernel.

    A query, key or value bound to the copy a product made of it (``made_for_a_product``) is
    refused: the pattern traced from that layout holds the copy, takes the match, and the copy
    goes with the products.

    A term missing from the match is a number the re-check matched as a literal (torch 2.11's
    matcher leaves it out of the re-check's bindings, later ones fill it in from the first
    match): refused like any other number, which the kernel cannot take as its mask.
    """
    tensors = bound_tensors(match, "q", "k", "v")
    if tensors is None or any(made_for_a_product(match.kwargs[n]) for n in ("q", "k", "v")):
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


def laid_out(example: torch.Tensor, heads_second: bool) -> torch.Tensor:
    """``example`` (batch, heads, length, dim) as it is stored: contiguous, or as a projection's
    output viewed per head and transposed (``view(b, s, h, d).transpose(1, 2)``)."""
    if not heads_second:
        return example
    return example.transpose(1, 2).contiguous().transpose(1, 2)


def layouts(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grouped: bool, copied: bool
) -> list[list[torch.Tensor]]:
    """Query, key and value in the combinations of ``laid_out``'s two layouts: all contiguous
    (``copied=False``), or each other combination (``copied=True``).

    A product of a batch of more than one transposed query, key or value cannot view it as a
    batch of matrices: it copies it first (``clone``), a node the pattern traced from contiguous
    values lacks. Grouped patterns copy key and value anyway (``repeat_kv``): only the query's
    layout makes a pattern of its own."""
    kv_layouts = ((False, False),) if grouped else tuple(itertools.product((False, True), repeat=2))
    combinations = [(a, *kv) for a in (False, True) for kv in kv_layouts]
    return [
        [laid_out(q, a), laid_out(k, b), laid_out(v, c)]
        for a, b, c in combinations
        if any((a, b, c)) == copied
    ]


def made_for_a_product(node: Any) -> bool:
    """Whether ``node`` is the copy a batched product makes of its operand (``clone``, then a
    ``view`` as matrices into ``bmm``, nothing else)."""
    if not (isinstance(node, torch.fx.Node) and node.target is torch.ops.aten.clone.default):
        return False
    users = list(node.users)
    return (
        len(users) == 1
        and users[0].target is torch.ops.aten.view.default
        and all(user.target is torch.ops.aten.bmm.default for user in users[0].users)
    )


def copies_an_operand(graph: torch.fx.Graph) -> bool:
    """Whether a batched product in ``graph`` copies an operand first: the graph may hold
    attention whose query, key or value ``layouts`` calls copied."""
    clones = graph.find_nodes(op="call_function", target=torch.ops.aten.clone.default)
    return any(made_for_a_product(node) for node in clones)


PATTERNS = (
    (grouped_masked, fused_masked),
    (grouped, fused),
    (plain_masked, fused_masked),
    (plain, fused),
    (grouped_masked_unscaled, fused_masked_unscaled),
    (grouped_unscaled, fused_unscaled),
    (plain_masked_unscaled, fused_masked_unscaled),
    (plain_unscaled, fused_unscaled),
    (plain_biased_masked_unscaled, fused_biased_masked_unscaled),
)
"""Each written-out attention and its fused form; those whose name starts with ``grouped``
repeat the key and value heads, those with a ``scale`` argument take it from the graph."""


def register(
    pass_dict: Any, dtype: torch.dtype = torch.float32, copied_operands: bool = False
) -> None:
    """The patterns traced in ``dtype`` (float32, or one of ``HALF_PRECISION``), for contiguous
    query, key and value, or for each layout that copies one of them (``layouts``)."""

    def example(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).to(dtype)

    q = example(2, 4, 3, 8)
    terms = {"mask": example(2, 1, 3, 5), "bias": example(2, 4, 3, 5)}
    for search, replace in PATTERNS:
        grouped_kv = search.__name__.startswith("grouped")
        k = example(2, 2 if grouped_kv else 4, 5, 8)
        parameters = inspect.signature(search).parameters
        extra = [terms[name] for name in parameters if name in terms]
        for qkv in layouts(q, k, k.clone(), grouped_kv, copied_operands):
            if "scale" in parameters:
                register_scaled_attention(
                    pass_dict, search, replace, [*qkv, *extra], check=check_for(search, dtype)
                )
            else:
                add_replacement(
                    pass_dict, search, replace, [*qkv, *extra], extra_check=check_for(search, dtype)
                )
