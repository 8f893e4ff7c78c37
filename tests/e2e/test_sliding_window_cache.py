"""A decode step over transformers' sliding-window ``StaticCache`` (Mistral, Gemma 2 and 3).

Its layers count the cached tokens in a Python int as well as in a tensor, and the model reads
the int: under ``torch.compile`` it is an int input of the graph whose value changes every step,
so every step is a new graph key and a new capture (the guide's "Int inputs"). These tests pin
that behaviour, the warning that names it, and the workaround the guide gives.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch

import npugraph_ex
from helpers import totals

transformers = pytest.importorskip("transformers")

SMALL_MISTRAL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)
CACHE_LENGTH = 16
STEPS = 6


@pytest.fixture(scope="module")
def mistral() -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL_MISTRAL))
    return model.eval()


def decode(step: Callable[..., torch.Tensor], cache: object) -> list[int]:
    """``STEPS`` greedy tokens, one decode step each."""
    ids, tokens = torch.tensor([[1]]), []
    for position in range(STEPS):
        logits = step(ids, torch.tensor([position]), cache)
        ids = logits[:, -1:].argmax(-1)
        tokens.append(int(ids))
    return tokens


def compiled_step(
    model: torch.nn.Module,
) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    def step(ids, pos, cache):  # noqa: ANN001, ANN202
        return model(input_ids=ids, past_key_values=cache, cache_position=pos).logits

    return step, torch.compile(step, backend="npugraph_ex", fullgraph=True)


@torch.no_grad()
def test_every_step_is_a_capture_and_the_graph_says_why(
    mistral: torch.nn.Module, caplog: pytest.LogCaptureFixture
) -> None:
    torch._dynamo.reset()
    step, compiled = compiled_step(mistral)
    cache = transformers.StaticCache(config=mistral.config, max_cache_len=CACHE_LENGTH)
    assert type(cache.layers[0]).__name__ == "StaticSlidingWindowLayer"
    expected = decode(
        step, transformers.StaticCache(config=mistral.config, max_cache_len=CACHE_LENGTH)
    )
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        assert decode(compiled, cache) == expected
    # The first step initialises the cache (its own graph); every later one is a new int value.
    assert totals()["captures"] == STEPS
    assert totals()["replays"] == 0
    (notice,) = [r.getMessage() for r in caplog.records if "differ only" in r.getMessage()]
    assert "has captured 4 keys that differ only in the values of its int inputs" in notice
    assert "values=[1, 1]; values=[2, 2]; values=[3, 3]; values=[4, 4]" in notice
    # The same values again, in the same cache memory: the keys captured first replay. Only the
    # first step's value, 0, is new to the step graph (the first run's went to the other graph).
    cache.reset()
    npugraph_ex.reset_stats()
    assert decode(compiled, cache) == expected
    assert totals()["captures"] == 1
    assert totals()["replays"] == STEPS - 1


@torch.no_grad()
def test_a_cache_of_full_attention_layers_replays(mistral: torch.nn.Module) -> None:
    """Within the window (``max_cache_len`` <= ``sliding_window``) no token ever slides out, so a
    cache of full-attention layers holds the same tokens, and keeps its count in a tensor only."""
    torch._dynamo.reset()
    step, compiled = compiled_step(mistral)
    assert CACHE_LENGTH <= mistral.config.sliding_window
    full = copy.deepcopy(mistral.config)
    full.sliding_window = None
    cache = transformers.StaticCache(config=full, max_cache_len=CACHE_LENGTH)
    assert type(cache.layers[0]).__name__ == "StaticLayer"
    expected = decode(
        step, transformers.StaticCache(config=mistral.config, max_cache_len=CACHE_LENGTH)
    )
    assert decode(compiled, cache) == expected
    # One graph initialises the cache, one is every later step.
    assert totals()["captures"] == 2
    assert totals()["replays"] == STEPS - 2
