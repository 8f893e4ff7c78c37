"""Random ops on the CPU: captured, and re-issued on every replay from the generator eager draws
from, so that each call, its key's first included, draws eager's numbers under one seed, and the
generator is left where eager leaves it. (A device graph refuses them: ``test_contract``.)"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from helpers import ANY_SPEED, graphs_called, totals
from npugraph_ex.compat import torch_at_least

SETTLE_SECONDS = 120


def draws(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every kind of draw a forward makes: dropout, a noise tensor, a mask, a sample."""
    h = torch.tanh(x)
    noise = h + torch.randn_like(h) * 0.1
    mask = torch.bernoulli(torch.sigmoid(h))
    sample = torch.multinomial(torch.softmax(h, dim=-1), 2)
    return F.dropout(h, 0.3, training=True), noise, mask, sample, torch.rand(3)


def seeded_call(fn: Callable[..., object], seed: int, *args: object) -> tuple[object, torch.Tensor]:
    """``fn(*args)`` after ``torch.manual_seed(seed)``, and the generator's next draw after it."""
    torch.manual_seed(seed)
    out = fn(*args)
    out = tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()
    return out, torch.rand(4)


def assert_draws_like_eager(fn: Callable[..., object], eager: Callable[..., object]) -> None:
    for seed, rows in enumerate((3, 3, 4, 3, 4, 4)):
        x = torch.randn(rows, 8)
        got, after = seeded_call(fn, seed, x)
        expected, eager_after = seeded_call(eager, seed, x)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b), (seed, rows)
        assert torch.equal(after, eager_after)  # the generator is where eager leaves it


@pytest.mark.parametrize(
    "options",
    [{}, {"num_warmup_iters": 0}, {"num_warmup_iters": 3}, {"clone_output": True}],
    ids=["default", "no-warm-up", "three-warm-ups", "clone-output"],
)
@torch.no_grad()
def test_each_call_draws_eagers_random_numbers(options: dict) -> None:
    options = {"static_kernel_compile": False, **options}
    fn = torch.compile(draws, backend="npugraph_ex", dynamic=False, options=options)
    assert_draws_like_eager(fn, draws)
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (2, 4, 0)
    x = torch.randn(3, 8)
    first, second = fn(x)[0].clone(), fn(x)[0].clone()
    assert not torch.equal(first, second)  # fresh numbers on every replay


@pytest.mark.skipif(
    not torch_at_least(2, 13),
    reason="torch 2.11's Inductor orders and decomposes these draws otherwise: other numbers",
)
@torch.no_grad()
def test_kernels_draw_eagers_random_numbers() -> None:
    # Inductor's kernels call ATen's random ops (``fallback_random``): its own random kernels
    # draw other numbers, and need seeds only its whole-graph passes put in. Eager's numbers
    # hold where Inductor keeps the draws in the graph's order, as here on torch 2.13.
    options = {"static_kernel_compile": True}
    fn = torch.compile(draws, backend="npugraph_ex", dynamic=False, options=options)
    assert_draws_like_eager(fn, draws)
    outcomes = [outcome for graph in graphs_called() for outcome in graph["static_kernels"]]
    assert len(outcomes) == 2 and "failed" not in outcomes  # a graph per shape, both on kernels
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (2, 4, 0)


class NoisyMlp(torch.nn.Module):
    """In training mode (its dropout active), called under ``no_grad``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 32)
        self.dropout = torch.nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.dropout(torch.relu(self.linear(x)))
        return h, torch.bernoulli(torch.sigmoid(h))


@torch.no_grad()
def test_the_background_tier_swaps_in_kernels_that_draw_eagers_numbers() -> None:
    # The swap runs the kernels and the ATen replay on one call, the generator put back between
    # the two: they agree, and the call draws once, as eager does.
    model = NoisyMlp()
    options = {"background_compile_after": 2, "background_min_gain": ANY_SPEED}
    fn = torch.compile(model, backend="npugraph_ex", options=options)
    deadline = time.monotonic() + SETTLE_SECONDS
    for seed in itertools.count():
        x = torch.randn(4, 16)
        got, after = seeded_call(fn, seed, x)
        expected, eager_after = seeded_call(model, seed, x)
        torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(got[0] == 0, expected[0] == 0)  # the same units dropped
        assert torch.equal(got[1], expected[1])
        assert torch.equal(after, eager_after)
        tiers = graphs_called()[0]["background"]
        if not {"aten", "queued", "pending", "trial"} & set(tiers):
            break
        assert time.monotonic() < deadline, tiers
        time.sleep(0.01)
    (graph,) = graphs_called()
    assert graph["background"] == {"kernels": 1}
    assert graph["eager_calls"] == {}


@torch.no_grad()
def test_a_compiled_sampling_step_generates_eagers_tokens(tiny_qwen3_config) -> None:
    # A decode step that samples its next token inside the compiled function (temperature,
    # then ``torch.multinomial``): each length is a key, each key's calls replay it.
    model = tiny_qwen3_config().eval()

    def next_token(ids: torch.Tensor) -> torch.Tensor:
        logits = model(ids).logits[:, -1] / 0.8
        return torch.multinomial(torch.softmax(logits, dim=-1), 1)

    fn = torch.compile(next_token, backend="npugraph_ex", fullgraph=True, dynamic=True)
    for seed in range(2):  # the second generation replays the first's keys
        ids = {"compiled": torch.tensor([[1, 2, 3]]), "eager": torch.tensor([[1, 2, 3]])}
        for form in ("compiled", "eager"):
            torch.manual_seed(seed)
            call = fn if form == "compiled" else next_token
            for _ in range(5):
                ids[form] = torch.cat([ids[form], call(ids[form])], dim=-1)
        assert torch.equal(ids["compiled"], ids["eager"])
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (5, 5, 0)
