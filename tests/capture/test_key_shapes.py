"""Keys of a CPU graph with symbolic row counts get the few-row split the pattern pass could not
apply: a key whose sizes give a product few rows captures that product split."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

import npugraph_ex
from helpers import aten_graph, intra_op_threads
from models import make_tiny_qwen3
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.bench.presets import QWEN3_PRESETS
from npugraph_ex.capture import key_shapes
from npugraph_ex.runtime.cpu import probes as host_probes

MM, BMM = "aten.mm.out", "aten.bmm.out"
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
"""The split sums each dot product in another kernel, perhaps in another order."""
WEIGHT = (256, 128)
"""The smallest weight the split takes (``MIN_WEIGHT_ELEMENTS``)."""


@pytest.fixture
def split_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two intra-op threads, on a host where the split and oneDNN's linear pay at every row
    count (whatever this one measures)."""
    monkeypatch.setattr(host_probes, "split_pays", lambda: True)
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: True)
    torch._dynamo.reset()
    with intra_op_threads(2):
        yield


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def ops_by_key(before: set[int]) -> dict[str, set[str]]:
    """The ATen ops each captured key replays (their ``out=`` overloads), by key label, over the
    graphs made since."""
    return {
        entry.label: set(aten_graph(entry).step_names)
        for manager in managers_since(before)
        for entry in manager.entries.values()
    }


def specialisation_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for graph in npugraph_ex.stats()["graphs"]:
        for outcome, n in graph["key_specialisation"].items():
            counts[outcome] = counts.get(outcome, 0) + n
    return counts


@torch.no_grad()
def test_a_few_row_key_of_a_dynamic_graph_replays_the_split_product(split_threads) -> None:
    before = live_graph_numbers()
    npugraph_ex.reset_stats()
    compiled = torch.compile(product, backend="npugraph_ex", dynamic=True, fullgraph=True)
    w = torch.randn(*WEIGHT)
    for rows in (3, 12, 3, 12):  # a capture of each, then a replay of each
        x = torch.randn(rows, 128)
        got = compiled(x, w)
        torch.testing.assert_close(got, product(x, w), **TOLERANCE)
        assert got.is_contiguous()
    keys = ops_by_key(before)
    (few,) = (ops for label, ops in keys.items() if "3x128" in label)
    (many,) = (ops for label, ops in keys.items() if "12x128" in label)
    assert BMM in few and MM not in few
    assert MM in many and BMM not in many
    assert specialisation_counts() == {"specialised": 1}
    assert npugraph_ex.stats()["totals"]["replays"] == 2


@torch.no_grad()
def test_a_row_count_of_two_sizes_is_read_from_both(split_threads) -> None:
    def flat_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 128) @ w.t()

    before = live_graph_numbers()
    compiled = torch.compile(flat_product, backend="npugraph_ex", dynamic=True)
    w = torch.randn(*WEIGHT)
    for batch, length in ((2, 3), (3, 4)):  # 6 rows, then 12
        x = torch.randn(batch, length, 128)
        torch.testing.assert_close(compiled(x, w), flat_product(x, w), **TOLERANCE)
    keys = ops_by_key(before)
    (six,) = (ops for label, ops in keys.items() if "2x3x128" in label)
    (twelve,) = (ops for label, ops in keys.items() if "3x4x128" in label)
    assert BMM in six and MM not in six
    assert MM in twelve and BMM not in twelve


@torch.no_grad()
def test_force_eager_runs_what_the_key_replays(split_threads) -> None:
    w = torch.randn(*WEIGHT)
    replayed = torch.compile(product, backend="npugraph_ex", dynamic=True)
    reference = torch.compile(
        product, backend="npugraph_ex", dynamic=True, options={"force_eager": True}
    )
    npugraph_ex.reset_stats()
    for rows in (3, 5, 3):
        x = torch.randn(rows, 128)
        assert torch.equal(replayed(x, w), reference(x, w))
    # Captures of 3 and 5 rows, then every force_eager call.
    assert specialisation_counts() == {"specialised": 5}
    assert npugraph_ex.stats()["totals"]["eager_calls"] == 3


@torch.no_grad()
def test_keys_with_many_rows_or_a_static_graph_run_as_compiled(split_threads, monkeypatch) -> None:
    def never(*args):  # noqa: ANN002, ANN202
        raise AssertionError("a split run for a key that has nothing to split")

    monkeypatch.setattr(key_shapes, "SplitRun", never)
    # oneDNN pays at some counts, not at these: the weight is too small to be given it, so the
    # graph has no product that a key would run as ``mm`` at them.
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: rows is None or rows < 12)
    npugraph_ex.reset_stats()
    w = torch.randn(*WEIGHT)
    dynamic = torch.compile(product, backend="npugraph_ex", dynamic=True)
    static = torch.compile(product, backend="npugraph_ex", dynamic=False)
    without_patterns = torch.compile(
        product,
        backend="npugraph_ex",
        dynamic=True,
        options={"disabled_passes": ["pattern_fusion_pass"]},
    )
    for rows in (12, 40):
        dynamic(torch.randn(rows, 128), w)
    static(torch.randn(3, 128), w)
    for rows in (3, 5):
        without_patterns(torch.randn(rows, 128), w)
    assert specialisation_counts() == {}
    assert npugraph_ex.stats()["totals"]["captures"] == 5


@torch.no_grad()
def test_a_split_that_fails_leaves_the_product_whole(split_threads, monkeypatch, caplog) -> None:
    def fails() -> None:
        raise RuntimeError("cannot split\nsecond line")

    monkeypatch.setattr(key_shapes, "split_of", lambda op, args: fails)
    before = live_graph_numbers()
    npugraph_ex.reset_stats()
    compiled = torch.compile(product, backend="npugraph_ex", dynamic=True)
    w = torch.randn(*WEIGHT)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for rows in (3, 5, 3):
            x = torch.randn(rows, 128)
            assert torch.equal(compiled(x, w), product(x, w))
    warnings = [r.getMessage() for r in caplog.records if "few-row product" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].endswith(
        "splitting a few-row product of a key failed (RuntimeError: cannot split); it runs as "
        "one product"
    )
    assert specialisation_counts() == {"failed": 2}
    assert all(MM in ops for ops in ops_by_key(before).values())
    assert npugraph_ex.stats()["totals"]["replays"] == 1


@torch.no_grad()
def test_a_generation_without_a_cache_splits_its_short_lengths(split_threads) -> None:
    pytest.importorskip("transformers")
    sizes = {**QWEN3_PRESETS["tiny"], "num_hidden_layers": 2}
    model = make_tiny_qwen3(**sizes)

    def step(ids):  # noqa: ANN001, ANN202
        return model(input_ids=ids, use_cache=False).logits

    before = live_graph_numbers()
    npugraph_ex.reset_stats()
    compiled = torch.compile(step, backend="npugraph_ex", dynamic=True)
    ids = eager_ids = torch.tensor([[1, 2, 3]])
    for _ in range(8):  # lengths 3 to 10: 3 to 8 are split
        logits, expected = compiled(ids), step(eager_ids)
        torch.testing.assert_close(logits, expected, **TOLERANCE)
        picked, eager_picked = logits[:, -1:].argmax(-1), expected[:, -1:].argmax(-1)
        assert torch.equal(picked, eager_picked)
        ids = eager_ids = torch.cat([ids, picked], dim=1)
    assert specialisation_counts() == {"specialised": 6}
    split_keys = [label for label, ops in ops_by_key(before).items() if MM not in ops]
    assert len(split_keys) == 6
