"""End to end: the token-by-token loops of the benchmark on a tiny random Qwen3 causal LM.

Two loops, both greedy:

- a growing sequence without KV cache, compiled with ``dynamic=True``: every new length is a new
  graph key, captured once and replayed when the same length comes back;
- a fixed-shape one-token decode step writing a ``transformers.StaticCache`` in place: one key,
  replayed on every step, its KV writes landing in the caller's cache.

And a step of four tokens over a ``StaticCache`` (speculative decoding's verify step), against
eager's.

Counters are read through ``npugraph_ex.stats()``. Each test zeroes them first; graphs of earlier
tests may still be alive, but they are not called here, so totals count this test's calls only.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

import npugraph_ex
from helpers import assert_same, counts, graphs_called
from npugraph_ex.bench.decode import cache_keyword

PROMPT_LEN = 4
NEW_TOKENS = 8
MAX_CACHE_LEN = 32
ATOL = 1e-5

Forward = Callable[[torch.Tensor], torch.Tensor]


def prompt_ids(model: torch.nn.Module, device: str, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT_LEN), generator=generator)
    return ids.to(device)


def two_prompts(model: torch.nn.Module, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The first pass captures; the second replays on other data, so stale memory cannot pass."""
    first, second = prompt_ids(model, device, seed=0), prompt_ids(model, device, seed=1)
    assert not torch.equal(first, second)
    return first, second


def growing_forward(model: torch.nn.Module) -> Forward:
    def forward(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    return forward


def compile_growing(model: torch.nn.Module, **options: Any) -> Forward:
    return torch.compile(
        growing_forward(model),
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=True,
        options={"capture_limit": 256, **options},
    )


def greedy_growing(forward: Forward, prompt: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Greedy decoding that re-runs the whole sequence per token: the ids and each call's logits."""
    ids, logits = prompt, []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            # A replay returns the graph's own memory: clone what must outlive the next call.
            step_logits = forward(ids).clone()
            logits.append(step_logits)
            ids = torch.cat([ids, step_logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids, logits


def test_growing_sequence_matches_eager_and_replays_each_length(
    tiny_qwen3_config: Callable[..., torch.nn.Module], device: str
) -> None:
    npugraph_ex.reset_stats()
    model = tiny_qwen3_config().to(device)
    prompts = two_prompts(model, device)
    eager = [greedy_growing(growing_forward(model), prompt) for prompt in prompts]
    # The ATen replay, compared bit for bit with force_eager: the graph's keys together turn it
    # hot, and kernels swapped in mid-run (when the compile is quick enough) round differently.
    compiled = compile_growing(model, static_kernel_compile=False)

    start = counts()
    captured = greedy_growing(compiled, prompts[0])
    after_first = counts()
    replayed = greedy_growing(compiled, prompts[1])
    after_second = counts()
    unoptimised_fn = compile_growing(model, force_eager=True)
    unoptimised = [greedy_growing(unoptimised_fn, prompt) for prompt in prompts]

    # Lengths PROMPT_LEN .. PROMPT_LEN + NEW_TOKENS - 1: each a new key, captured once, then
    # replayed when the second loop brings it back.
    assert after_first - start == Counter(captures=NEW_TOKENS)
    assert after_second - after_first == Counter(replays=NEW_TOKENS)
    # dynamic=True: one FX graph serves every length.
    (graph,) = [g for g in graphs_called() if "force_eager" not in g["eager_calls"]]
    assert graph["live_keys"] == NEW_TOKENS
    assert counts()["eager:force_eager"] == 2 * NEW_TOKENS

    assert not torch.equal(eager[0][0], eager[1][0])
    for (ids, logits), (eager_ids, eager_logits), (unoptimised_ids, unoptimised_logits) in zip(
        (captured, replayed), eager, unoptimised, strict=True
    ):
        assert ids.shape == (1, PROMPT_LEN + NEW_TOKENS)
        assert torch.equal(ids, eager_ids)
        assert torch.equal(unoptimised_ids, eager_ids)
        for step in range(NEW_TOKENS):
            assert_same(logits[step], unoptimised_logits[step], device)
            torch.testing.assert_close(logits[step], eager_logits[step], atol=ATOL, rtol=0)


def test_growing_sequence_past_capture_limit(
    tiny_qwen3_config: Callable[..., torch.nn.Module], device: str
) -> None:
    limit = 3
    npugraph_ex.reset_stats()
    model = tiny_qwen3_config().to(device)
    prompts = two_prompts(model, device)
    eager = [greedy_growing(growing_forward(model), prompt) for prompt in prompts]
    compiled = compile_growing(model, capture_limit=limit)

    start = counts()
    first = greedy_growing(compiled, prompts[0])
    after_first = counts()
    second = greedy_growing(compiled, prompts[1])
    after_second = counts()

    over = NEW_TOKENS - limit
    assert after_first - start == Counter(
        {"captures": limit, "eager_calls": over, "eager:capture_limit": over}
    )
    # The captured lengths keep replaying; only the lengths past the limit run eagerly.
    assert after_second - after_first == Counter(
        {"replays": limit, "eager_calls": over, "eager:capture_limit": over}
    )
    for (ids, logits), (eager_ids, eager_logits) in zip((first, second), eager, strict=True):
        assert torch.equal(ids, eager_ids)
        for step in range(NEW_TOKENS):
            torch.testing.assert_close(logits[step], eager_logits[step], atol=ATOL, rtol=0)


def decode_step(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    def step(ids: torch.Tensor, position: torch.Tensor, cache: Any) -> torch.Tensor:
        return model(
            input_ids=ids, **{cache_keyword(model): cache}, cache_position=position, use_cache=True
        ).logits

    return step


def greedy_decode(
    step: Callable[..., torch.Tensor], cache: Any, prompt: torch.Tensor
) -> tuple[torch.Tensor, list]:
    """One token per call: the prompt is fed token by token, then NEW_TOKENS are generated."""
    ids, logits = prompt, []
    with torch.no_grad():
        for position in range(PROMPT_LEN + NEW_TOKENS - 1):
            # A fresh (1, 1) tensor each step: a slice of ``ids`` would carry a growing stride.
            token = torch.tensor([[ids[0, position].item()]], device=ids.device)
            cache_position = torch.tensor([position], device=ids.device)
            step_logits = step(token, cache_position, cache)[:, -1].clone()
            logits.append(step_logits)
            if position + 1 == ids.shape[1]:
                ids = torch.cat([ids, step_logits.argmax(-1, keepdim=True)], dim=1)
    return ids, logits


def assert_caches_close(actual: Any, expected: Any) -> None:
    assert len(actual.layers) == len(expected.layers)
    for got, want in zip(actual.layers, expected.layers, strict=True):
        torch.testing.assert_close(got.keys, want.keys, atol=ATOL, rtol=0)
        torch.testing.assert_close(got.values, want.values, atol=ATOL, rtol=0)
        assert int(got.cumulative_length) == int(want.cumulative_length)


STATIC_KERNELS = pytest.param({"static_kernel_compile": True}, marks=pytest.mark.slow, id="static")


@pytest.mark.parametrize("options", [pytest.param({}, id="replay"), STATIC_KERNELS])
def test_static_cache_decode_replays_and_writes_callers_cache(
    tiny_qwen3_config: Callable[..., torch.nn.Module], device: str, options: dict[str, Any]
) -> None:
    transformers = pytest.importorskip("transformers")
    npugraph_ex.reset_stats()
    model = tiny_qwen3_config().to(device)
    prompts = two_prompts(model, device)
    calls = PROMPT_LEN + NEW_TOKENS - 1
    eager_step = decode_step(model)
    compiled = torch.compile(
        decode_step(model), backend="npugraph_ex", fullgraph=True, options=options
    )
    eager_cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
    cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)

    for prompt in prompts:
        # The second pass reuses both caches, zeroed in place: the KV tensors keep their
        # addresses, so every call of it replays.
        eager_cache.reset()
        cache.reset()
        eager_ids, eager_logits = greedy_decode(eager_step, eager_cache, prompt)
        before = counts()
        ids, logits = greedy_decode(compiled, cache, prompt)
        done = counts() - before

        assert ids.shape == (1, PROMPT_LEN + NEW_TOKENS)
        assert torch.equal(ids, eager_ids)
        for got, want in zip(logits, eager_logits, strict=True):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        # The decode step wrote the caller's cache in place, as eager did.
        assert_caches_close(cache, eager_cache)
        assert int(cache.layers[0].cumulative_length) == calls
        if prompt is prompts[0]:
            # The first call initialises the cache (its own graph); every later step is one key.
            assert done["eager_calls"] == 0
            assert 1 <= done["captures"] <= 2
            assert done["replays"] == calls - done["captures"]
            if options:
                # Every key runs Inductor kernels made for its shapes; none fell back.
                kernels = Counter()
                for graph in graphs_called():
                    kernels.update(graph["static_kernels"])
                assert set(kernels) <= {"compiled", "cache_hit"}
                assert kernels.total() == done["captures"]
        else:
            assert done == Counter(replays=calls)


def test_tokens_checked_four_at_a_time_match_eager(
    tiny_qwen3_config: Callable[..., torch.nn.Module], device: str
) -> None:
    # A speculative decoding's verify step: 4 positions at once over a StaticCache, whose
    # grouped heads run as query rows of the key heads (few enough positions); one key, replayed
    # at each new start.
    transformers = pytest.importorskip("transformers")
    npugraph_ex.reset_stats()
    model = tiny_qwen3_config().to(device)
    step = decode_step(model)
    compiled = torch.compile(decode_step(model), backend="npugraph_ex", fullgraph=True)
    eager_cache, cache = (
        transformers.StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN) for _ in range(2)
    )
    prompt, prompt_positions = prompt_ids(model, device, 0), torch.arange(PROMPT_LEN, device=device)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        step(prompt, prompt_positions, eager_cache)
        step(prompt, prompt_positions, cache)
        before = counts()
        for start in range(PROMPT_LEN, PROMPT_LEN + 12, 4):
            ids = torch.randint(0, model.config.vocab_size, (1, 4), generator=generator)
            ids, positions = ids.to(device), torch.arange(start, start + 4, device=device)
            expected = step(ids, positions, eager_cache)
            actual = compiled(ids, positions, cache)
            torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
    assert_caches_close(cache, eager_cache)
    assert counts() - before == Counter(captures=1, replays=2)


def test_growing_sequence_is_the_same_with_pools_shared_or_per_key(
    tiny_qwen3_config: Callable[..., torch.nn.Module],
) -> None:
    model = tiny_qwen3_config()
    prompt = prompt_ids(model, "cpu", seed=2)
    eager_ids, _ = greedy_growing(growing_forward(model), prompt)
    runs = {}
    for reuse in (True, False):
        npugraph_ex.reset_stats()
        # The ATen replay's pools, compared bit for bit: no compiled kernels swapped in.
        forward = compile_growing(
            model, reuse_graph_pool_in_same_fx=reuse, static_kernel_compile=False
        )
        # Unlike greedy_growing, keep each call's logits uncloned: a later length never
        # overwrites an output the caller still holds. The second pass replays every length.
        with torch.no_grad():
            for _ in range(2):
                ids, held = prompt, []
                for _ in range(NEW_TOKENS):
                    held.append(forward(ids))
                    ids = torch.cat([ids, held[-1][:, -1].argmax(-1, keepdim=True)], dim=1)
        (graph,) = graphs_called()
        assert (graph["captures"], graph["replays"]) == (NEW_TOKENS, NEW_TOKENS)
        runs[reuse] = ids, [t.clone() for t in held], graph
    (shared_ids, shared_logits, shared), (own_ids, own_logits, own) = runs[True], runs[False]
    assert torch.equal(shared_ids, eager_ids) and torch.equal(own_ids, eager_ids)
    for a, b in zip(shared_logits, own_logits, strict=True):
        assert torch.equal(a, b)
    assert (shared["pools"], own["pools"]) == (1, NEW_TOKENS)
    assert shared["pool_bytes"] < own["pool_bytes"] / 2


def generate_settings() -> dict[str, Any]:
    return dict(max_new_tokens=NEW_TOKENS, do_sample=False)


def test_hugging_face_generate_with_a_static_cache_recaptures_once_per_call(
    tiny_qwen3_config: Callable[..., torch.nn.Module], device: str
) -> None:
    # The way Hugging Face documents torch.compile: compile the forward, let generate() drive it.
    # generate() makes a new StaticCache per call, so the KV tensors the graphs write move and
    # both keys (prefill, one-token step) are captured again once per call, then replayed.
    model = tiny_qwen3_config().to(device)
    settings = {**generate_settings(), "cache_implementation": "static"}
    prompts = two_prompts(model, device)
    expected = [model.generate(prompt, **settings) for prompt in prompts]
    npugraph_ex.reset_stats()
    model.forward = torch.compile(model.forward, backend="npugraph_ex", fullgraph=True)
    for prompt, want in zip(prompts, expected, strict=True):
        assert torch.equal(model.generate(prompt, **settings), want)
    prefill, step = graphs_called()
    assert prefill["eager_calls"] == step["eager_calls"] == {}
    if device != "cpu":
        # There the prefill copies the cache's position counter (a CPU scalar) to the device and
        # makes the cache's tensors as its own outputs: every call is captured or replayed, but
        # which of them recapture depends on where a new cache's tensors land.
        assert prefill["captures"] + prefill["replays"] == 2
        assert step["captures"] + step["replays"] == 2 * (NEW_TOKENS - 1)
        return
    assert prefill["recaptures"] == step["recaptures"] == {"mutated input moved": 1}
    assert (prefill["captures"], step["captures"]) == (2, 2)
    assert (prefill["replays"], step["replays"]) == (0, 2 * (NEW_TOKENS - 2))


def test_hugging_face_generate_called_again_and_again_copies_the_prefills_cache(
    tiny_qwen3_config: Callable[..., torch.nn.Module], caplog: pytest.LogCaptureFixture
) -> None:
    # Each generate() writes a new StaticCache: the prefill graph, never replayed, is captured
    # again on every call; after four such calls it copies the cache in and out instead, and
    # replays. The one-token step replays between its moves, so it keeps the caller's cache.
    model = tiny_qwen3_config()
    settings = {**generate_settings(), "cache_implementation": "static"}
    prompts = [prompt_ids(model, "cpu", seed=seed) for seed in range(7)]
    expected = [model.generate(prompt, **settings) for prompt in prompts]
    npugraph_ex.reset_stats()
    model.forward = torch.compile(model.forward, backend="npugraph_ex", fullgraph=True)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for prompt, want in zip(prompts, expected, strict=True):
            assert torch.equal(model.generate(prompt, **settings), want)
    prefill, step = graphs_called()
    assert prefill["recaptures"] == {"mutated input moved": 4}
    assert prefill["dropped_keys"] == {"written inputs copied from now on": 1}
    assert (prefill["captures"], prefill["replays"]) == (6, 1)
    assert step["recaptures"] == {"mutated input moved": 6}
    assert step["dropped_keys"] == {}
    assert (step["captures"], step["replays"]) == (7, 7 * (NEW_TOKENS - 2))
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("npugraph_ex: graph[0/0] was captured again on each of its last 4")


def test_hugging_face_generate_replays_a_cache_the_caller_keeps(
    tiny_qwen3_config: Callable[..., torch.nn.Module], device: str
) -> None:
    transformers = pytest.importorskip("transformers")
    model = tiny_qwen3_config().to(device)
    prompts = [prompt_ids(model, device, seed=seed) for seed in range(3)]
    expected = [
        model.generate(p, **generate_settings(), cache_implementation="static") for p in prompts
    ]
    cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
    model.forward = torch.compile(model.forward, backend="npugraph_ex", fullgraph=True)
    npugraph_ex.reset_stats()
    for prompt, want in zip(prompts, expected, strict=True):
        cache.reset()  # zeroed in place: the KV tensors keep their addresses
        before = counts()
        assert torch.equal(
            model.generate(prompt, **generate_settings(), **{cache_keyword(model): cache}), want
        )
        done = counts() - before
    assert counts()["recaptures"] == 0 and counts()["eager_calls"] == 0
    assert done == Counter(replays=NEW_TOKENS)  # the last prompt: prefill and every step replay
