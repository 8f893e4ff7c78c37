"""End to end: every architecture of the model zoo (``tests/zoo/models.py``) against eager.

For each model, forward calls of one shape with new inputs each time: one capture, then replays
that match eager and fall back to nothing; for a few image models also with ``dynamic=True`` over
two batch sizes, a capture per size. For the decoders and encoder-decoders, greedy ``generate()``
with the forward compiled, with transformers' default cache and (decoders) with a ``StaticCache``
the caller keeps: the same tokens as eager, and a second generation that replays every step. A few
small models also run with ``static_kernel_compile=True``, and two image models with
``static_kernel_compile="background"`` until their keys settle.

``make test`` checks the forward of every text model, of ViT and of ResNet (static and dynamic),
and GPT-2's generation with both caches; the other image models, generations, static and
background kernels and the bit-for-bit comparison with Dynamo alone are marked ``zoo`` and run
with ``make zoo`` (about 6 minutes on 2 cores once torch's compile caches are warm), which also
writes the same results, and eager and replay times, as a table to ``docs/zoo.md``
(``PYTHONPATH=src:tests python -m zoo.table --out docs/zoo.md``).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from helpers import graphs_called
from zoo.background import BACKGROUND_ASSERTED, check_background
from zoo.checks import CALLS, DYNAMIC_BATCHES, NEW_TOKENS, check_forward, check_generate
from zoo.models import ZOO

pytest.importorskip("transformers")

QUICK_GENERATE = {"gpt2"}
"""Generation checked in ``make test`` (each takes tens of seconds to compile on 2 cores)."""
QUICK_VISION = {"vit", "resnet"}
"""Image models whose forward ``make test`` checks: a transformer and a convolutional network
(the others share their families of ops, and take seconds each to compile on 2 cores)."""


def generation_params(kinds: tuple[str, ...]) -> list:
    return [
        pytest.param(name, marks=() if name in QUICK_GENERATE else pytest.mark.zoo)
        for name, entry in ZOO.items()
        if entry.kind in kinds
    ]


def forward_params(names: list[str]) -> list:
    return [
        pytest.param(
            name,
            marks=pytest.mark.zoo
            if ZOO[name].kind == "vision" and name not in QUICK_VISION
            else (),
        )
        for name in names
    ]


def assert_close_to_eager(compiled: list[torch.Tensor], eager: list[torch.Tensor]) -> None:
    """Within float32's default tolerance (``atol=1e-5``), of logits far larger than it: a
    model whose activations die out would pass any tolerance."""
    for got, want in zip(compiled, eager, strict=True):
        assert want.abs().max() > 1e-2
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", forward_params(list(ZOO)))
def test_forward_replays_and_matches_eager(name: str) -> None:
    check = check_forward(ZOO[name])
    # One shape: the first call captures, the others replay; nothing ran eagerly.
    assert check.counters == Counter(captures=1, replays=CALLS - 1)
    assert not torch.equal(check.eager[0], check.eager[1])
    assert_close_to_eager(check.compiled, check.eager)


@pytest.mark.parametrize(
    "name", forward_params([name for name, entry in ZOO.items() if entry.dynamic])
)
def test_forward_with_dynamic_batches_replays_and_matches_eager(name: str) -> None:
    check = check_forward(ZOO[name], dynamic=True)
    # One graph for every batch size: a key captured per size, then replays, nothing eager.
    sizes = len(set(DYNAMIC_BATCHES))
    assert check.counters == Counter(captures=sizes, replays=len(DYNAMIC_BATCHES) - sizes)
    assert len(graphs_called()) == 1
    assert_close_to_eager(check.compiled, check.eager)


@pytest.mark.zoo
@pytest.mark.parametrize("name", list(ZOO))
def test_forward_without_fusion_equals_dynamo_bit_for_bit(name: str) -> None:
    check = check_forward(ZOO[name], {"pattern_fusion_pass": False}, reference="dynamo")
    assert check.counters == Counter(captures=1, replays=CALLS - 1)
    assert check.equal


@pytest.mark.parametrize("name", generation_params(("decoder", "seq2seq")))
def test_generate_with_the_default_cache_matches_eager(name: str) -> None:
    check = check_generate(ZOO[name], "dynamic")
    for got, want in zip(check.compiled, check.eager, strict=True):
        assert torch.equal(got, want)
    # Every prefill and step of the second generation has the shapes of one of the first.
    assert check.per_call[1] == Counter(replays=NEW_TOKENS)
    assert check.counters["eager_calls"] == 0


@pytest.mark.parametrize("name", generation_params(("decoder",)))
def test_generate_with_a_static_cache_matches_eager(name: str) -> None:
    check = check_generate(ZOO[name], "static")
    for got, want in zip(check.compiled, check.eager, strict=True):
        assert torch.equal(got, want)
    # The cache is reset in place between generations: the second replays the prefill and
    # every step, with no recapture for a moved cache tensor.
    if "generate, StaticCache" in ZOO[name].fallbacks:
        # The prefill's graph cannot be captured (the registry says why): it runs eagerly on
        # each call, and the decode steps replay.
        fallback = {"eager_calls": 1, "eager:cannot capture": 1}
        assert check.per_call[1] == Counter(replays=NEW_TOKENS - 1, **fallback)
    else:
        assert check.per_call[1] == Counter(replays=NEW_TOKENS)
        assert check.counters["eager_calls"] == 0


@pytest.mark.zoo
@pytest.mark.parametrize("name", [name for name, entry in ZOO.items() if entry.options])
def test_forward_with_static_kernels_matches_eager(name: str) -> None:
    entry = ZOO[name]
    check = check_forward(entry, entry.options)
    assert check.counters == Counter(captures=1, replays=CALLS - 1)
    assert_close_to_eager(check.compiled, check.eager)
    # The key replays Inductor kernels made for its shapes; none failed to compile.
    (graph,) = graphs_called()
    assert set(graph["static_kernels"]) <= {"compiled", "cache_hit"}
    assert sum(graph["static_kernels"].values()) == 1


@pytest.mark.zoo
@pytest.mark.parametrize("name", BACKGROUND_ASSERTED)
def test_forward_in_the_background_settles_close_to_eager(name: str) -> None:
    check = check_background(ZOO[name])
    # Every key left ATen and its trial: kept kernels, or the ATen replay kept for a reason.
    assert check.settling.settled, check.settling
    # Every call, before, during and after the swap: kernels are close to eager, not equal.
    assert_close_to_eager(check.compiled, check.eager)
