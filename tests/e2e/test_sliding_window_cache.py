"""A decode step over transformers' sliding-window ``StaticCache`` (Mistral, Gemma 2 and 3).

Its layers count the cached tokens in a Python int as well as in a tensor, and the model reads
the int: under ``torch.compile`` it is an int input of the graph whose value changes every step.
It only enters arithmetic, tensor operands and the graph's int outputs, so it leaves the device
graph (the ``split_host_ints`` pass) and every step replays one capture, instead of being a new key
and a new capture each step.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from helpers import totals
from models import seeded
from npugraph_ex.bench.decode import cache_keyword

transformers = pytest.importorskip("transformers")

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)
STEPS = 6


def build(family: str) -> torch.nn.Module:
    if family == "mistral":
        return seeded(
            lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL)), 0
        )
    # Gemma 2: sliding and full attention layers, alternating.
    config = transformers.Gemma2Config(**SMALL, head_dim=16)
    return seeded(lambda: transformers.Gemma2ForCausalLM(config), 0)


def decode(step: Callable[..., torch.Tensor], cache: object) -> list[int]:
    """``STEPS`` greedy tokens, one decode step each."""
    ids, tokens = torch.tensor([[1]]), []
    for position in range(STEPS):
        logits = step(ids, torch.tensor([position]), cache)
        ids = logits[:, -1:].argmax(-1)
        tokens.append(int(ids))
    return tokens


@torch.no_grad()
@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_every_step_replays_one_capture(family: str) -> None:
    model = build(family)

    def step(ids, pos, cache):  # noqa: ANN001, ANN202
        return model(input_ids=ids, **{cache_keyword(model): cache}, cache_position=pos).logits

    def new_cache() -> object:
        return transformers.StaticCache(config=model.config, max_cache_len=16)

    cache = new_cache()
    assert "StaticSlidingWindowLayer" in {type(layer).__name__ for layer in cache.layers}
    compiled = torch.compile(step, backend="npugraph_ex", fullgraph=True)
    expected = decode(step, new_cache())
    assert decode(compiled, cache) == expected
    # One graph initialises the cache (its first step); the other is every later step.
    assert totals()["captures"] == 2
    assert totals()["replays"] == STEPS - 2
    # Parameters keep their place among the inputs once the int has left them: a weight at a
    # new address is a new key (keyed on its address), not an input copied into the old one.
    model.lm_head.weight.data = model.lm_head.weight.detach().clone()
    compiled(torch.tensor([[1]]), torch.tensor([STEPS]), cache)
    assert totals()["captures"] == 3


@torch.no_grad()
def test_hugging_face_generate_replays_the_decode_steps() -> None:
    model = build("mistral")
    prompt = torch.tensor([[1, 5, 7, 9]])
    expected = model.generate(prompt, max_new_tokens=12, do_sample=False)
    model.forward = torch.compile(model.forward, backend="npugraph_ex", fullgraph=True)
    cache = transformers.StaticCache(config=model.config, max_cache_len=64)
    out = model.generate(
        prompt, max_new_tokens=12, do_sample=False, **{cache_keyword(model): cache}
    )
    assert torch.equal(out, expected)
    # The prefill and the first decode step are a capture each (the int is 0, then symbolic);
    # the other 10 decode steps replay.
    assert totals()["captures"] == 2
    assert totals()["replays"] == 10
