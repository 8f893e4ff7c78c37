"""Memory pools through ``torch.compile``: one pool per FX graph, shared handles, older outputs."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import npugraph_ex
from helpers import assert_same, graphs_called, totals
from models import make_cnn, make_mlp
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.errors import ConfigError

THREADED_RUN = Path(__file__).with_name("threaded_replay_run.py")


def compiled(fn, **options):
    return torch.compile(fn, backend="npugraph_ex", fullgraph=True, dynamic=True, options=options)


def expand(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = (x @ w).relu()
    return torch.cat([h, h.sigmoid()], dim=-1) * 2


@torch.no_grad()
def test_an_older_keys_outputs_keep_their_values_when_another_key_runs(device: str) -> None:
    w = torch.randn(16, 32, device=device)
    fn = compiled(expand)
    small, big, small_again = (torch.randn(n, 16, device=device) for n in (4, 64, 4))
    fn(small, w)
    held_big = fn(big, w)  # captured after the small key, in the same pool
    expected_big = expand(big, w)
    fn(small_again, w)
    latest = fn(small, w)  # both replays of the small key write while the caller holds held_big
    assert_same(held_big, expected_big, device)
    assert_same(latest, expand(small, w), device)
    assert [g["pools"] for g in graphs_called()] == [1]


def views_writes_and_aliases(x: torch.Tensor, cache: torch.Tensor, row: torch.Tensor):
    h = (x @ x.t()).softmax(-1)
    cache.index_copy_(0, row, h[:1, :4])  # an input written in place
    top = h[:2]
    return h, top, top.t(), h.sum(0), cache[row]  # outputs aliasing each other and the cache


@pytest.mark.parametrize("reuse", [True, False], ids=["shared pool", "pool per key"])
@torch.no_grad()
def test_views_input_writes_and_aliased_outputs_match_eager_across_keys(device, reuse) -> None:
    fn = compiled(views_writes_and_aliases, reuse_graph_pool_in_same_fx=reuse)
    cache, eager_cache = (torch.zeros(8, 4, device=device) for _ in range(2))
    held = []
    for step, rows in enumerate((5, 9, 6, 5, 9, 6)):
        x = torch.randn(rows, 3, device=device)
        row = torch.tensor([step % 8], device=device)
        got = fn(x, cache, row)
        expected = views_writes_and_aliases(x, eager_cache, row)
        held.append((got, [t.clone() for t in expected]))
        for actual, want in zip(got, expected, strict=True):
            assert_same(actual, want, device)
        assert_same(cache, eager_cache, device)
        # The aliasing eager has, the outputs have.
        assert got[1].data_ptr() == got[0].data_ptr() and got[2].data_ptr() == got[0].data_ptr()
    # Each length's latest outputs still hold their values after the other lengths ran.
    for got, expected in held[-3:]:
        for actual, want in zip(got[:4], expected[:4], strict=True):
            assert_same(actual, want, device)
    assert (totals()["captures"], totals()["replays"]) == (3, 3)


def pool_bytes_total() -> int:
    """Bytes of every live pool; earlier tests' graphs may still be alive, so compare deltas.
    Their garbage goes first: freed in the middle of a test, it would shift the delta."""
    gc.collect()
    return npugraph_ex.stats()["totals"]["pool_bytes"]


def key_bytes(graph: dict) -> list[int]:
    return [info["pool_bytes"] for info in graph["keys"].values()]


@torch.no_grad()
def test_keys_sharing_a_pool_hold_the_largest_key_not_the_sum() -> None:
    w = torch.randn(16, 32)
    before = pool_bytes_total()
    fns = {
        "shared": compiled(expand),
        "per key": compiled(expand, reuse_graph_pool_in_same_fx=False),
    }
    for fn in fns.values():
        for rows in (8, 64, 32, 16):
            assert torch.equal(
                fn(torch.full((rows, 16), 0.5), w), expand(torch.full((rows, 16), 0.5), w)
            )
    shared, per_key = graphs_called()
    assert (shared["pools"], per_key["pools"]) == (1, 4)
    assert key_bytes(shared) == key_bytes(per_key)
    assert per_key["pool_bytes"] == sum(key_bytes(per_key))
    # Outputs were dropped at once, so the largest key's arena and output slot serve every key.
    assert shared["pool_bytes"] == max(key_bytes(shared))
    assert pool_bytes_total() - before == shared["pool_bytes"] + per_key["pool_bytes"]


@torch.no_grad()
def test_the_keys_of_a_model_hold_one_tuple_of_its_parameters_addresses() -> None:
    before = live_graph_numbers()
    model = make_mlp()
    fn = torch.compile(model, backend="npugraph_ex", dynamic=True)
    for rows in (3, 5, 7):
        x = torch.randn(rows, 32)
        assert torch.equal(fn(x), model(x))
    (manager,) = managers_since(before)
    keys, entries = list(manager.entries), list(manager.entries.values())
    assert len(keys) == 3 and len(keys[0][4]) == 6  # the norm's and two linears' weights, biases
    held = {id(key[4]) for key in keys} | {id(e.staged.parameter_addresses) for e in entries}
    assert len(held) == 1


@torch.no_grad()
def test_two_models_sharing_one_pool_handle_stay_correct_called_alternately(device: str) -> None:
    mlp, cnn = make_mlp().to(device), make_cnn().to(device)
    pool = npugraph_ex.graph_pool_handle(device)
    before = pool_bytes_total()
    fast_mlp = compiled(mlp, use_graph_pool=pool)
    fast_cnn = compiled(cnn, use_graph_pool=pool)
    held = []
    for step in range(4):
        x = torch.randn(3 + step % 2, 32, device=device)
        image = torch.randn(2, 3, 16, 16, device=device)
        held.append((fast_mlp(x), mlp(x)))
        held.append((fast_cnn(image), cnn(image)))
        for got, expected in held[-2:]:
            torch.testing.assert_close(got, expected)
    # The latest output of each key (mlp's two row counts, cnn's one shape), held through the
    # other model's calls, is intact; an earlier output of a key is its next replay's to rewrite.
    for got, expected in (held[-4], held[-2], held[-1]):
        torch.testing.assert_close(got, expected)
    graphs = graphs_called()
    assert len(graphs) == 2 and all(g["pools"] == 1 for g in graphs)
    if device == "cpu":  # each graph reports the shared pool whole; the totals count it once
        assert [g["pool_bytes"] for g in graphs] == [pool.nbytes] * 2
        assert pool_bytes_total() - before == pool.nbytes


@torch.no_grad()
def test_a_pool_handle_takes_new_graphs_after_every_graph_in_it_was_released(device: str) -> None:
    # A device's allocator forgets a graph pool once every graph captured into it is released;
    # a capture into a forgotten pool that still holds blocks (an output the caller kept) fails
    # inside CUDA's capture_begin and leaves every later random op of the process failing.
    before = live_graph_numbers()
    pool = npugraph_ex.graph_pool_handle(device)
    w, x = torch.randn(16, 32, device=device), torch.randn(4, 16, device=device)
    first = compiled(expand, use_graph_pool=pool)
    kept = first(x, w)
    expected = expand(x, w)
    del first
    torch._dynamo.reset()
    gc.collect()
    assert live_graph_numbers() <= before  # the first graph and its capture are gone
    second = compiled(lambda x, w: expand(x, w) + 1, use_graph_pool=pool)
    for _ in range(2):
        assert_same(second(x, w), expected + 1, device)
    assert_same(kept, expected, device)
    torch.randn(3, device=device)  # random numbers still work
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (1, 1, 0)


def test_a_pool_handle_of_another_device_is_rejected_with_the_fix() -> None:
    fn = compiled(expand, use_graph_pool=(0, 7))
    with pytest.raises(Exception) as raised:
        fn(torch.randn(4, 16), torch.randn(16, 32))
    cause = raised.value
    while cause is not None and not isinstance(cause, ConfigError):
        cause = cause.__cause__ or cause.__context__
    assert str(cause) == (
        "use_graph_pool must be a pool handle for cpu graphs, got (0, 7); make one with "
        "npugraph_ex.graph_pool_handle('cpu')"
    )
    assert cause.option == "use_graph_pool"


@torch.no_grad()
def test_clone_output_returns_private_copies_from_a_shared_pool(device: str) -> None:
    w = torch.randn(16, 32, device=device)
    fn = compiled(expand, clone_output=True)
    x = torch.randn(4, 16, device=device)
    first, second = fn(x, w), fn(x, w)
    assert first.data_ptr() != second.data_ptr()
    third = fn(torch.randn(4, 16, device=device), w)
    assert_same(first, expand(x, w), device)
    assert third.data_ptr() not in (first.data_ptr(), second.data_ptr())


@pytest.mark.parametrize(
    "mode",
    [[], ["same-key"], ["same-key-held"]],
    ids=["two-keys", "same-key-clone-output", "same-key-held"],
)
def test_two_threads_replaying_one_pool_get_their_own_results(mode: list[str]) -> None:
    # In a fresh process: before torch 2.12, Dynamo's own state does not survive threads.
    done = subprocess.run(
        [sys.executable, str(THREADED_RUN), *mode], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report.pop("pool_bytes")
    # Every call a replay (the report names what any other call was).
    assert report == {
        "failures": [],
        "replays": 2 * 40,
        "captures": 0,
        "recaptures": 0,
        "eager_calls": 0,
        "failed_calls": 0,
        "failed_passes": 0,
    }


def rows_and_transpose(x: torch.Tensor, w: torch.Tensor):
    h = (x @ w).relu()
    return h, h.t(), h[1:]


@torch.no_grad()
def test_clone_output_keeps_outputs_that_view_one_another_as_views(device: str) -> None:
    fn = compiled(rows_and_transpose, clone_output=True)
    w = torch.randn(16, 32, device=device)
    for _ in range(2):  # the capture, then a replay
        h, ht, tail = fn(torch.randn(4, 16, device=device), w)
        assert h.untyped_storage().data_ptr() == ht.untyped_storage().data_ptr()
        assert tail.untyped_storage().data_ptr() == h.untyped_storage().data_ptr()
        h.fill_(7.0)  # as in eager, a write through one output shows through the others
        assert bool((ht == 7.0).all()) and bool((tail == 7.0).all())
    assert totals()["replays"] == 1


@torch.no_grad()
def test_input_buffers_of_every_key_share_the_pool_and_are_counted() -> None:
    def double_then_sum(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(0)

    fn = compiled(double_then_sum)
    fn(torch.randn(64, 1024))  # the largest key first: later keys fit in what it placed
    one_key = totals()["pool_bytes"]
    assert one_key >= 2 * 64 * 1024 * 4  # its input buffer and its product, at least
    for rows in range(8, 64, 4):
        x = torch.randn(rows, 1024)
        assert torch.equal(fn(x), double_then_sum(x))
        assert torch.equal(fn(x + 1), double_then_sum(x + 1))
    assert totals()["captures"] == 15
    assert totals()["pool_bytes"] == one_key


@torch.no_grad()
def test_outputs_that_view_an_input_buffer_follow_it_into_the_pool() -> None:
    # unsafe_split's pieces view its input without being views to autograd: the graph returns
    # slices of its own input buffer, which runs no kernel at all.
    def pieces(x: torch.Tensor):
        return torch.unsafe_split(x, 2)

    fn = compiled(pieces)
    for _ in range(3):
        x = torch.randn(5, 3)
        for got, want in zip(fn(x), pieces(x), strict=True):
            assert torch.equal(got, want)
    assert totals()["replays"] == 2
