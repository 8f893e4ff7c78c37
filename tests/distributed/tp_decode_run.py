"""One rank of a tensor-parallel Qwen3 decode step: prints a JSON report.

    python tp_decode_run.py --rank R --world W --port P

Every rank builds the same model (the micro Qwen3 preset, one seed) and keeps a whole copy as the
reference; the other copy is split Megatron-style: the query, key, value, gate and up
projections by output features (heads and MLP columns), the output and down projections by input
features, each followed by an all_reduce of its partial sums. An eager prefill fills a
``StaticCache`` holding this rank's heads, then decode steps run through ``torch.compile``
(``npugraph_ex``, static shapes) and the whole model decodes the same tokens alongside.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from gloo_group import join_gloo_group
from torch import nn

STEPS = 6
PROMPT = 5


class RowParallelLinear(nn.Module):
    """This rank's input columns of a linear layer; the all_reduce adds the ranks' parts."""

    def __init__(self, linear: nn.Linear, rank: int, world: int):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world, dim=1)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight)
        dist.all_reduce(y)
        return y


def keep_rows(linear: nn.Linear, rank: int, world: int) -> None:
    """This rank's output features of ``linear`` (column-parallel), in place."""
    linear.weight = nn.Parameter(linear.weight.detach().chunk(world, dim=0)[rank].clone())
    linear.out_features = linear.weight.shape[0]


def shard(model: nn.Module, rank: int, world: int) -> None:
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        for linear in (attention.q_proj, attention.k_proj, attention.v_proj):
            keep_rows(linear, rank, world)
        attention.o_proj = RowParallelLinear(attention.o_proj, rank, world)
        keep_rows(mlp.gate_proj, rank, world)
        keep_rows(mlp.up_proj, rank, world)
        mlp.down_proj = RowParallelLinear(mlp.down_proj, rank, world)


def decode(model: nn.Module, step: object, prompt: torch.Tensor) -> tuple[list, list]:
    """Eager prefill into a new StaticCache, then ``STEPS`` greedy steps through ``step``."""
    from transformers import StaticCache

    from npugraph_ex.bench.decode import cache_keyword

    cache = StaticCache(config=model.config, max_cache_len=PROMPT + STEPS + 1)
    state = {"use_cache": True, cache_keyword(model): cache}
    logits = model(input_ids=prompt, cache_position=torch.arange(PROMPT), **state).logits[:, -1]
    tokens, all_logits = [logits.argmax(-1, keepdim=True)], [logits]
    for index in range(STEPS):
        position = torch.tensor([PROMPT + index])
        out = step(input_ids=tokens[-1], cache_position=position, **state)
        all_logits.append(out.logits[:, -1].clone())
        tokens.append(all_logits[-1].argmax(-1, keepdim=True))
    return tokens, all_logits


def main() -> None:
    rank, world = join_gloo_group()
    import npugraph_ex
    from npugraph_ex.bench.presets import build_qwen3

    with torch.no_grad():
        whole = build_qwen3("micro", seed=0)
        split = build_qwen3("micro", seed=0)
        shard(split, rank, world)
        prompt = torch.randint(
            0, whole.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1)
        )
        step = torch.compile(split.forward, backend="npugraph_ex", dynamic=False)
        tokens, logits = decode(split, step, prompt)
        want_tokens, want_logits = decode(whole, whole.forward, prompt)
    graphs = [g for g in npugraph_ex.stats()["graphs"] if g["captures"] or g["eager_calls"]]
    diffs = [float((a - b).abs().max()) for a, b in zip(logits, want_logits, strict=True)]
    print(json.dumps({
        "tokens_equal": all(torch.equal(a, b) for a, b in zip(tokens, want_tokens, strict=True)),
        "max_logit_diff": max(diffs),
        "captures": sum(g["captures"] for g in graphs),
        "replays": sum(g["replays"] for g in graphs),
        "eager_calls": sum(sum(g["eager_calls"].values()) for g in graphs),
        "graphs": len(graphs),
    }))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
