"""A Qwen3 split over the ranks of a process group, and a decode step that overlaps its
all_reduces with the other half of the batch.

Megatron-style split: every rank keeps its share of the attention heads and MLP columns (the
query, key, value, gate and up projections cut by output features), and the output and down
projections cut by input features, whose partial sums an all_reduce adds up.

``TwoBatchStep`` runs a batch of two sequences as two micro-batches, layer by layer:

    attention(a) -> all_reduce(a)        with overlap, each all_reduce is a stream block:
    attention(b) -> all_reduce(b)        attention(b) runs while a's partial sums travel,
    mlp(a)       -> all_reduce(a)        mlp(a) while b's do, and so on
    mlp(b)       -> all_reduce(b)

Without overlap the same all_reduces run in place on the main path. Each micro-batch keeps its
own ``StaticCache``; the step takes a float mask (0 where a position may be attended, -inf
elsewhere), so prefill and decode are the same function. Used by ``benchmarks/tp_overlap.py`` and
the distributed tests, with ``torch.distributed`` already initialised.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from npugraph_ex.scope import stream


class RowParallelLinear(nn.Module):
    """This rank's input columns of a linear layer; with ``reduce``, an all_reduce adds the
    ranks' parts, else the caller reduces the partial sums it returns."""

    def __init__(self, linear: nn.Linear, rank: int, world: int, reduce: bool = True):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world, dim=1)[rank].clone())
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight)
        if self.reduce:
            dist.all_reduce(y)
        return y


def keep_rows(linear: nn.Linear, rank: int, world: int) -> None:
    """This rank's output features of ``linear`` (column-parallel), in place."""
    linear.weight = nn.Parameter(linear.weight.detach().chunk(world, dim=0)[rank].clone())
    linear.out_features = linear.weight.shape[0]


def shard(model: nn.Module, rank: int, world: int, reduce: bool = True) -> None:
    """Split a ``Qwen3ForCausalLM`` in place: this rank's heads and MLP columns."""
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        for linear in (attention.q_proj, attention.k_proj, attention.v_proj):
            keep_rows(linear, rank, world)
        attention.o_proj = RowParallelLinear(attention.o_proj, rank, world, reduce)
        keep_rows(mlp.gate_proj, rank, world)
        keep_rows(mlp.up_proj, rank, world)
        mlp.down_proj = RowParallelLinear(mlp.down_proj, rank, world, reduce)


def causal_mask(positions: torch.Tensor, length: int) -> torch.Tensor:
    """``[1, 1, len(positions), length]``: 0 up to each query's position, -inf after it."""
    allowed = torch.arange(length)[None, :] <= positions[:, None]
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    return mask[None, None]


class TwoBatchStep(nn.Module):
    """The logits of two sequences, each a micro-batch with its own cache (see the module
    docstring); ``overlap`` puts every all_reduce on the ``"comm"`` stream."""

    def __init__(self, model: nn.Module, overlap: bool):
        super().__init__()
        self.model = model
        self.overlap = overlap
        forward = model.model.layers[0].self_attn.forward
        self.cache_keyword = (
            "cache" if "cache" in inspect.signature(forward).parameters else ("past_key_values")
        )

    def reduced(self, partial: torch.Tensor) -> torch.Tensor:
        if self.overlap:
            with stream("comm"):
                dist.all_reduce(partial)
        else:
            dist.all_reduce(partial)
        return partial

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, caches: list[Any]
    ) -> torch.Tensor:
        inner = self.model.model
        hidden = [inner.embed_tokens(ids[i : i + 1]) for i in range(2)]
        rotary = inner.rotary_emb(hidden[0], positions[None])
        for layer in inner.layers:
            parts = [
                self.reduced(self.attention(layer, hidden[i], rotary, mask, caches[i], positions))
                for i in range(2)
            ]
            hidden = [hidden[i] + parts[i] for i in range(2)]
            parts = [
                self.reduced(layer.mlp(layer.post_attention_layernorm(hidden[i]))) for i in range(2)
            ]
            hidden = [hidden[i] + parts[i] for i in range(2)]
        return self.model.lm_head(inner.norm(torch.cat(hidden)))

    def attention(
        self,
        layer: nn.Module,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        cache: Any,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        out, _ = layer.self_attn(
            hidden_states=layer.input_layernorm(hidden),
            position_embeddings=rotary,
            attention_mask=mask,
            cache_position=positions,
            **{self.cache_keyword: cache},
        )
        return out


def new_caches(model: nn.Module, length: int) -> list[Any]:
    """Two ``StaticCache``s of one sequence each, ``length`` positions long."""
    from transformers import StaticCache

    return [StaticCache(config=model.config, max_cache_len=length) for _ in range(2)]
