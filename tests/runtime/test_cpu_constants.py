"""Constant steps: what depends on a key's sizes alone runs once at capture, and nothing else."""

from __future__ import annotations

import pytest
import torch

from helpers import aten_graph
from helpers import capture_on_cpu as capture
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.runtime.cpu import constants as cpu_constants


def causal_scores(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    positions = torch.arange(n)
    hidden = positions[:, None] < positions[None, :]
    return x.masked_fill(hidden, -1.0).softmax(-1)


def test_steps_that_depend_on_sizes_alone_run_once_at_capture() -> None:
    x = torch.randn(5, 5)
    graph = capture(causal_scores, x)
    assert graph.step_kinds["constant"] == 2  # arange, lt
    assert graph.step_names == ["aten.masked_fill.Scalar_out", "aten._softmax.out"]
    for _ in range(3):
        x.copy_(torch.randn(5, 5))
        graph.replay()
        assert torch.equal(graph.outputs[0], causal_scores(x))


def test_constants_keep_their_values_while_other_captures_reuse_the_pool() -> None:
    first, second = torch.randn(6, 6), torch.randn(6, 6)
    graph = capture(causal_scores, first)
    pool = graph.placed.pool
    other = capture(lambda y: (y * 3).exp() + 1, second, pool=pool)
    for _ in range(2):
        second.copy_(torch.randn(6, 6))
        other.replay()  # writes the shared arena
        first.copy_(torch.randn(6, 6))
        graph.replay()
        assert torch.equal(graph.outputs[0], causal_scores(first))


def test_a_step_reading_an_input_is_replayed() -> None:
    def shifted_positions(x, offset):
        return torch.arange(x.shape[0]) + offset, x * 2

    x, offset = torch.randn(4), torch.tensor(1)
    graph = capture(shifted_positions, x, offset)
    assert graph.step_kinds["constant"] == 1  # arange; the sum reads the input
    assert graph.step_names[0] == "aten.add.out"
    offset.fill_(7)
    graph.replay()
    assert graph.outputs[0].tolist() == [7, 8, 9, 10]


def test_a_storage_a_replayed_step_writes_is_not_constant() -> None:
    def accumulate(x):
        total = torch.zeros(x.shape)
        total.add_(x)
        return total * 2

    x = torch.randn(3)
    graph = capture(accumulate, x)
    assert graph.step_kinds["constant"] == 0
    x.copy_(torch.randn(3))
    graph.replay()
    assert torch.equal(graph.outputs[0], accumulate(x))


def test_a_value_read_between_two_constant_writes_is_replayed() -> None:
    def scaled_twice(x):
        scale = torch.arange(x.shape[0], dtype=x.dtype)
        first = x * scale
        scale.mul_(2)
        return first + x * scale

    x = torch.randn(4)
    graph = capture(scaled_twice, x)
    assert "aten.arange.start_out" in graph.step_names or "aten.arange.out" in graph.step_names
    x.copy_(torch.randn(4))
    graph.replay()
    assert torch.equal(graph.outputs[0], scaled_twice(x))


def test_outputs_are_recomputed_even_where_constant() -> None:
    def with_positions(x):
        return x + 1, torch.arange(x.shape[0])

    x = torch.randn(4)
    graph = capture(with_positions, x)
    assert graph.step_kinds["constant"] == 0
    graph.outputs[1].fill_(-5)  # a caller writing into an output it holds
    graph.replay()
    assert graph.outputs[1].tolist() == [0, 1, 2, 3]


def test_random_kernels_are_replayed() -> None:
    def noisy(x):
        return x + torch.rand(x.shape)

    x = torch.zeros(64)
    graph = capture(noisy, x)
    assert graph.step_kinds["constant"] == 0
    before = graph.outputs[0].clone()
    graph.replay()
    assert not torch.equal(graph.outputs[0], before)


def test_a_constant_larger_than_the_limit_stays_in_the_pool(monkeypatch) -> None:
    monkeypatch.setattr(cpu_constants, "MAX_BYTES", 5 * 5 * 8 - 1)  # below arange(25)'s int64s
    x = torch.randn(25)
    graph = capture(lambda y: y * torch.arange(25), x)
    assert graph.step_kinds["constant"] == 0
    x.copy_(torch.randn(25))
    graph.replay()
    assert torch.equal(graph.outputs[0], x * torch.arange(25))


def test_constant_bytes_count_in_the_captures_memory(monkeypatch) -> None:
    x = torch.randn(8, 8)
    folded = capture(causal_scores, x)
    replayed = capture(causal_scores, x, disabled=("fold_constants",))
    assert replayed.step_kinds["constant"] == 0
    # The bool mask the replay reads; the int64 arange it was built from is freed.
    assert folded.constant_bytes == 8 * 8
    assert folded.pool_bytes >= folded.constant_bytes
    assert torch.equal(folded.outputs[0], replayed.outputs[0])


def growing_scores(x: torch.Tensor) -> torch.Tensor:
    return causal_scores(x @ x.t())


def test_each_key_of_a_dynamic_graph_keeps_its_own_constants() -> None:
    before = live_graph_numbers()
    compiled = torch.compile(growing_scores, backend="npugraph_ex", dynamic=True)
    for length in (5, 7, 5, 9, 7, 5):
        x = torch.randn(length, 3)
        assert torch.equal(compiled(x), growing_scores(x))
    (manager,) = [m for m in managers_since(before) if m.entries]
    assert len(manager.entries) == 3
    assert all(aten_graph(e).step_kinds["constant"] >= 2 for e in manager.entries.values())


@pytest.mark.slow
def test_qwen3_forward_without_a_cache_folds_its_mask_and_positions(monkeypatch) -> None:
    from npugraph_ex.bench.presets import build_qwen3

    model = build_qwen3("tiny", seed=0)
    tokens = torch.arange(12)[None]

    def logits(disabled: list[str] = ()) -> tuple[torch.Tensor, object]:
        before = live_graph_numbers()
        compiled = torch.compile(
            lambda ids: model(input_ids=ids, use_cache=False).logits,
            backend="npugraph_ex",
            dynamic=False,
            options={"disabled_build_steps": disabled},
        )
        with torch.no_grad():
            compiled(tokens)
            out = compiled(tokens).clone()
        (manager,) = [m for m in managers_since(before) if m.entries]
        return out, aten_graph(next(iter(manager.entries.values())))

    folded_logits, folded = logits()
    torch._dynamo.reset()
    replayed_logits, replayed = logits(["fold_constants"])
    assert folded.step_kinds["constant"] >= 20
    assert replayed.kernel_count - folded.kernel_count == folded.step_kinds["constant"]
    assert "aten.arange.out" not in folded.step_names
    assert torch.equal(folded_logits, replayed_logits)


def test_a_failure_to_find_constants_replays_every_step_and_says_so(monkeypatch, caplog) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("no access\nsecond line")

    monkeypatch.setattr(cpu_constants, "constant_steps", broken)
    monkeypatch.setattr(
        cpu_constants, "log_once", lambda logger, level, key, *message: logger.log(level, *message)
    )
    x = torch.randn(5, 5)
    with caplog.at_level("WARNING", logger="npugraph_ex.runtime.cpu.constants"):
        graph = capture(causal_scores, x)
    assert graph.step_kinds["constant"] == 0
    assert "aten.arange.out" in graph.step_names
    assert caplog.messages == [
        "npugraph_ex: running a capture's constant steps once failed (RuntimeError: no access); "
        "its replay runs every step"
    ]
    x.copy_(torch.randn(5, 5))
    graph.replay()
    assert torch.equal(graph.outputs[0], causal_scores(x))


def test_one_element_constants_are_shared_by_captures_of_other_sizes() -> None:
    def floor_at_minus_one(x):
        return torch.where(x > 0, x, torch.scalar_tensor(-1.0))

    short, long = torch.randn(4), torch.randn(9)
    first, second = capture(floor_at_minus_one, short), capture(floor_at_minus_one, long)
    assert first.step_kinds["constant"] == second.step_kinds["constant"] == 1
    assert first.constant_bytes == second.constant_bytes == 0  # not this key's alone
    (scalar_first,) = [args[2] for fn, args, _ in first.steps if "where" in str(fn)]
    (scalar_second,) = [args[2] for fn, args, _ in second.steps if "where" in str(fn)]
    assert scalar_first.data_ptr() == scalar_second.data_ptr()
    for x, graph in ((short, first), (long, second)):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(graph.outputs[0], floor_at_minus_one(x))
