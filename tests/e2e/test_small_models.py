"""End to end: small vision and MLP models, and a function split by a graph break.

Every model runs under ``torch.no_grad()`` (replays happen only there). New random inputs of a
shape already seen must replay and match eager; counters come from ``npugraph_ex.stats()``,
zeroed at the start of each test (graphs of earlier tests are not called here).
"""

from __future__ import annotations

import torch

import npugraph_ex
from helpers import assert_same, graphs_called, totals
from models import make_cnn, make_mlp


def test_mlp_dynamic_batch_replays_each_seen_size(device: str, seed: int) -> None:
    npugraph_ex.reset_stats()
    model = make_mlp(dim=32, hidden=64).to(device)
    compiled = torch.compile(
        model,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=True,
        options={"capture_limit": 256},
    )
    batches = (2, 5, 2, 5, 2, 5)
    held = []
    with torch.no_grad():
        for batch in batches:
            x = torch.randn(batch, 32, device=device)
            out = compiled(x)
            assert_same(out, model(x), device)
            held.append((x, out.clone()))

    assert totals()["captures"] == 2
    assert totals()["replays"] == len(batches) - 2
    assert totals()["eager_calls"] == 0
    (graph,) = graphs_called()  # dynamic=True: both batch sizes share one FX graph
    assert graph["live_keys"] == 2
    # The clones taken after each call still hold that call's result.
    with torch.no_grad():
        for x, out in held:
            assert_same(out, model(x), device)


def test_cnn_static_shape_replays(device: str, seed: int) -> None:
    npugraph_ex.reset_stats()
    model = make_cnn(in_channels=3, channels=8, image_size=16, num_classes=10).to(device)
    compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True)
    calls = 4
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(2, 3, 16, 16, device=device)
            expected = model(x)
            out = compiled(x)
            assert out.shape == (2, 10)
            assert_same(out, expected, device)

    assert totals()["captures"] == 1
    assert totals()["replays"] == calls - 1
    assert totals()["eager_calls"] == 0
    assert len(graphs_called()) == 1


def split_by_graph_break(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    hidden = torch.tanh(x @ weight) * 2
    torch._dynamo.graph_break()
    return torch.sigmoid(hidden @ weight.t()) + x


def test_graph_break_captures_both_halves(device: str, seed: int) -> None:
    npugraph_ex.reset_stats()
    weight = torch.randn(8, 16, device=device)
    # Bit-identical is the contract without fusion patterns; ``hidden @ weight.t()`` (4 rows)
    # is one the few-row product pattern would split.
    compiled = torch.compile(
        split_by_graph_break, backend="npugraph_ex", options={"pattern_fusion_pass": False}
    )
    calls = 3
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(4, 8, device=device)
            assert_same(compiled(x, weight), split_by_graph_break(x, weight), device)

    halves = graphs_called()
    assert len(halves) == 2
    for half in halves:
        assert (half["captures"], half["replays"], half["eager_calls"]) == (1, calls - 1, {})
