"""Grouped-query attention without copying K and V for every query head.

Hugging Face models repeat each key/value head for the query heads that share it (``repeat_kv``:
unsqueeze, expand, a contiguous copy, reshape) before ``scaled_dot_product_attention``. The fused
attention kernels read shared heads directly (``enable_gqa=True``):

    before: %k4 = _unsafe_view(clone(expand(unsqueeze(%k, 2)))); (same for %v)
            %o = _scaled_dot_product_flash_attention_for_cpu(%q, %k4, %v4, attn_mask=%m, scale=s)
    after:  %o = _scaled_dot_product_flash_attention_for_cpu(%q, %k, %v, attn_mask=%m, scale=s)

Two copies of the KV cache per layer and step disappear. With one query position (a decode step),
or a few (as many as the device's platform says pay: ``Platform.grouped_rows_max_positions``, 8
on CPU, none elsewhere until measured), and a mask shared by every head, the heads that
share a key head become its query rows instead (``[batch, key heads, heads per key head x
positions, dim]``, attention without ``enable_gqa``), the form transformers runs for one token
outside ``torch.compile``; so does an attention the graph already holds on shared heads
(transformers' sdpa attention passes ``enable_gqa=True`` itself when there is no mask, eagerly
too). Applied where the kernel can read the heads in place: query, key and value of one dtype and
device, key and value of one shape, the query heads a multiple of the key heads, and a scale that
is a number. Tolerance: bit-identical on CPU (the same kernel reads the same values in the same
order); the one-token form equals transformers' own one-token form bit for bit, and the repeated
or shared heads' within rounding (the kernel blocks the rows differently: up to 8e-7 in float32,
1e-3 in bfloat16).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from npugraph_ex.passes.patterns.checks import bound, bound_tensors, is_number, one_kind, same_shape
from npugraph_ex.passes.patterns.registry import add_replacement
from npugraph_ex.runtime.platform import platform_for

SCALE = 0.125


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, heads, length, dim = x.shape
    expanded = x[:, :, None, :, :].expand(batch, heads, n_rep, length, dim)
    return expanded.reshape(batch, heads * n_rep, length, dim)


def masked_search(q, k, v, mask, scale):  # noqa: ANN001, ANN201
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask, scale=scale
    )


def masked_replace(q, k, v, mask, scale):  # noqa: ANN001, ANN201
    return grouped_attention(q, k, v, mask, scale)


def grouped_attention(q, k, v, mask=None, scale=None):  # noqa: ANN001, ANN201
    """Attention of query heads grouped on the key heads, read in place: for a few query
    positions with a mask the same for every head, the key heads' query rows; else
    ``enable_gqa``."""
    if few_query_rows(q, mask):
        return grouped_rows_attention(q, k, v, mask, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def few_query_rows(q: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """No more query positions (one: a decode step) than the platform of the query's device runs
    as rows (``Platform.grouped_rows_max_positions``), known for every value of the sizes, and
    no mask or a mask the same for every head."""
    known = statically_known_true
    most = platform_for(q.device.type).grouped_rows_max_positions()
    if q.dim() != 4 or not known(q.shape[2] <= most):
        return False
    return mask is None or (mask.dim() == 4 and known(mask.shape[1] == 1))


def grouped_rows_attention(q, k, v, mask, scale):  # noqa: ANN001, ANN201
    """A few query positions' heads that share a key head as that head's query rows: a plain
    attention over the key heads, ``[batch, key heads, heads per key head x positions, dim]``,
    which the CPU kernel runs 4.3x-6.6x faster than ``enable_gqa`` at one position in bfloat16
    and 1.0x-1.5x in float32 (what transformers runs for one token outside ``torch.compile``).
    A mask with a row per position is repeated for each head of a group (the rows of one head
    come together); a mask of one row serves every row as it is."""
    batch, heads, positions, dim = q.shape
    groups = k.shape[1]
    per_group = heads // groups
    rows = q.reshape(batch, groups, per_group * positions, dim)
    if mask is not None and not statically_known_true(mask.shape[2] == 1):
        masks, _, _, length = mask.shape
        tiled = mask.unsqueeze(2).expand(masks, 1, per_group, positions, length)
        mask = tiled.reshape(masks, 1, per_group * positions, length)
    out = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=scale)
    return out.reshape(batch, heads, positions, dim)


def causal_search(q, k, v, scale):  # noqa: ANN001, ANN201
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True, scale=scale
    )


def causal_replace(q, k, v, scale):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


def shared_search(q, k, v, scale):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)


def shared_replace(q, k, v, scale):  # noqa: ANN001, ANN201
    return grouped_rows_attention(q, k, v, None, scale)


def shared_masked_search(q, k, v, mask, scale):  # noqa: ANN001, ANN201
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def scale_is_a_number(match: Any) -> bool:
    """The fused kernels take the scale as a Python number (or none: the default); a graph may
    multiply by a 0-d tensor instead, which they cannot take. (Absent: a number the re-check
    matched as a literal, as ``rms_norm.fusable`` explains.)"""
    scale = match.kwargs.get("scale")
    return scale is None or is_number(scale)


def grouped_heads(match: Any) -> bool:
    """Query, key and value are tensors of one floating dtype and device, key and value of one
    shape, and the query heads a multiple of the key heads (what ``enable_gqa`` requires)."""
    tensors = bound_tensors(match, "q", "k", "v")
    if tensors is None:
        return False
    q, k, v = tensors
    return (
        one_kind([q, k, v])
        and q.dim() == k.dim() == v.dim() == 4
        and same_shape(k.shape, v.shape)
        and statically_known_true(q.shape[1] % k.shape[1] == 0)
    )


def shared_heads_in_few_rows(match: Any) -> bool:
    """Grouped heads (``grouped_heads``) that are not one per key head, read in place at a few
    query positions with no mask or a mask the same for every head (``few_query_rows``)."""
    if not grouped_heads(match):
        return False
    q, k = bound_tensors(match, "q", "k")
    mask = bound(match, "mask")
    if mask is not None and not isinstance(mask, torch.Tensor):
        return False
    return statically_known_true(q.shape[1] != k.shape[1]) and few_query_rows(q, mask)


def register_scaled_attention(
    pass_dict: Any,
    search: Any,
    replace: Any,
    inputs: list[torch.Tensor],
    check: Any = grouped_heads,
) -> None:
    """Register an attention pattern whose last argument is the scale: taken from the matched
    graph as a number (``SCALE`` only stands for it while tracing), refused where it is not one,
    or where ``check`` refuses the match."""
    add_replacement(
        pass_dict,
        search,
        replace,
        [*inputs, SCALE],
        extra_check=lambda match: scale_is_a_number(match) and check(match),
        scalar_workaround={"scale": SCALE},
    )


def register(pass_dict: Any) -> None:
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8)
    mask = torch.zeros(1, 1, 3, 5)
    register_scaled_attention(pass_dict, masked_search, masked_replace, [q, k, k.clone(), mask])
    register_scaled_attention(
        pass_dict, causal_search, causal_replace, [torch.randn(1, 4, 5, 8), k, k.clone()]
    )
    one_row, row_mask = torch.randn(1, 4, 1, 8), torch.zeros(1, 1, 1, 5)
    for search, replace, inputs in (
        (shared_search, shared_replace, [one_row, k, k.clone()]),
        (shared_masked_search, masked_replace, [one_row, k, k.clone(), row_mask]),
    ):
        register_scaled_attention(pass_dict, search, replace, inputs, shared_heads_in_few_rows)
