"""A mixture-of-experts decoder: each token's experts are chosen by the router on every replay.

The capture holds the routing as kernels (top-k, gathers, scatters), not as the choices the
capturing call made: a replay with other tokens must pick other experts, exactly as eager does.
"""

from __future__ import annotations

import torch

import npugraph_ex
from models import TINY_QWEN3, seeded

NO_FUSION = {"pattern_fusion_pass": False}
"""Every pass but the fusion patterns: the replay must then equal eager bit for bit."""


def make_tiny_qwen3_moe() -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **TINY_QWEN3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
    )
    return seeded(lambda: Qwen3MoeForCausalLM(config), 0)


@torch.no_grad()
def test_replays_route_each_call_as_eager_does() -> None:
    model = make_tiny_qwen3_moe()
    step = torch.compile(model, backend="npugraph_ex", fullgraph=True, options=NO_FUSION)
    generator = torch.Generator().manual_seed(0)
    # Three prompts of one shape: one capture, two replays. Their tokens send most positions to
    # other experts than the first prompt's (in the first layer, 5 of 6 positions each).
    prompts = [torch.randint(0, 500, (1, 6), generator=generator) for _ in range(3)]
    logits = [step(input_ids=ids).logits.clone() for ids in prompts]
    for ids, got in zip(prompts, logits, strict=True):
        assert torch.equal(got, model(input_ids=ids).logits)
    assert not torch.equal(logits[1], logits[2])
    totals = npugraph_ex.stats()["totals"]
    assert (totals["captures"], totals["replays"], totals["eager_calls"]) == (1, 2, 0)
