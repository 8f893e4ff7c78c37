"""The capture-and-replay contract (DESIGN section 5), one test per rule, on every device."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import npugraph_ex
from helpers import assert_same, assert_trees_equal, graphs_called, totals
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.errors import UnsupportedGraphError


def only_graph() -> dict:
    graphs = graphs_called()
    assert len(graphs) == 1, graphs
    return graphs[0]


def compiled(fn, **options):
    dynamic = options.pop("dynamic", True)
    return torch.compile(
        fn, backend="npugraph_ex", fullgraph=True, dynamic=dynamic, options=options or None
    )


def mixed_ops(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # No fusion pattern matches here, so the contract is bit-identical results (F.linear with a
    # bias is addmm both in eager and in the graph; ``x @ w + b`` would be fused into one).
    h = torch.nn.functional.layer_norm(torch.nn.functional.linear(x, w.t(), b), (w.shape[1],))
    return torch.softmax(h, dim=-1) * torch.sigmoid(h).sum(-1, keepdim=True) - h.mean()


@torch.no_grad()
def test_replay_is_bit_identical_to_eager(device: str) -> None:
    w, b = torch.randn(8, 16, device=device), torch.randn(16, device=device)
    fn = compiled(mixed_ops)
    for _ in range(4):
        x = torch.randn(5, 8, device=device)
        assert torch.equal(fn(x, w, b), mixed_ops(x, w, b))
    assert totals()["captures"] == 1
    assert totals()["replays"] == 3


@torch.no_grad()
def test_new_shape_captures_and_known_shape_replays(device: str) -> None:
    w, b = torch.randn(8, 16, device=device), torch.randn(16, device=device)
    fn = compiled(mixed_ops)
    for rows in (2, 3, 2, 3, 4):
        x = torch.randn(rows, 8, device=device)
        assert torch.equal(fn(x, w, b), mixed_ops(x, w, b))
    graph = only_graph()
    assert graph["captures"] == 3
    assert graph["replays"] == 2
    assert graph["live_keys"] == 3
    assert sorted(info["replays"] for info in graph["keys"].values()) == [0, 1, 1]


class KvCache(torch.nn.Module):
    """Writes one row of a caller-owned cache in place and reads the whole cache."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, cache: torch.Tensor, pos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, self.proj(x))
        return cache.sum(0) * 2


@torch.no_grad()
def test_mutated_input_lands_in_the_callers_tensor(device: str) -> None:
    model = KvCache().to(device)
    fn = compiled(model, dynamic=False)
    eager_cache = torch.zeros(6, 4, device=device)
    graph_cache = torch.zeros(6, 4, device=device)
    for step in range(6):
        pos = torch.tensor([step], device=device)
        x = torch.randn(1, 4, device=device)
        expected = model(eager_cache, pos, x)
        assert torch.equal(fn(graph_cache, pos, x), expected)
        assert torch.equal(graph_cache, eager_cache)
    assert totals()["captures"] == 1
    assert totals()["replays"] == 5


@torch.no_grad()
def test_mutated_input_at_a_new_address_recaptures(device: str) -> None:
    model = KvCache().to(device)
    fn = compiled(model, dynamic=False)
    pos, x = torch.tensor([1], device=device), torch.randn(1, 4, device=device)
    first, second = torch.zeros(6, 4, device=device), torch.zeros(6, 4, device=device)
    fn(first, pos, x)
    fn(first, pos, x)
    out = fn(second, pos, x)
    assert torch.equal(out, model(torch.zeros(6, 4, device=device), pos, x))
    assert torch.equal(second, first)
    assert only_graph()["recaptures"] == {"mutated input moved": 1}
    assert totals()["captures"] == 2


def add_into_second(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    torch.add(x, y, out=y)
    return y.t()


def write_both(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.add_(1), y.mul_(2), x.t()


@pytest.mark.parametrize("fn", [add_into_second, write_both])
@pytest.mark.parametrize("kernels", [False, True], ids=["aten", "kernels"])
@torch.no_grad()
def test_inputs_that_view_one_tensor_are_written_where_the_caller_sees_them(
    device: str, fn, kernels: bool
) -> None:
    """``f(b[0], b[1])``: the two inputs share one storage as traced. A write to the second
    was once taken for a write to the first, so the second was copied, written in the copy,
    and the caller's tensor never changed."""
    compiled_fn = compiled(fn, dynamic=False, static_kernel_compile=kernels)
    for _ in range(3):
        base = torch.randn(2, 3, 3, device=device)
        eager_base = base.clone()
        assert_trees_equal(compiled_fn(base[0], base[1]), fn(eager_base[0], eager_base[1]))
        assert torch.equal(base, eager_base)


@torch.no_grad()
def test_a_written_input_new_on_every_call_is_said_once_and_copied_from_then_on(
    caplog: pytest.LogCaptureFixture, device: str
) -> None:
    # Every call's cache is a new tensor: every call is a capture, which the graph says once,
    # after four in a row (a replay between two moves starts the count again); from then on
    # the graph copies the cache in and out, and replays.
    model = KvCache().to(device)
    fn = compiled(model, dynamic=False)
    pos, x = torch.tensor([1], device=device), torch.randn(1, 4, device=device)
    kept = torch.zeros(6, 4, device=device)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for cache in [torch.zeros(6, 4, device=device) for _ in range(3)] + [kept, kept]:
            fn(cache, pos, x)  # three moves in a row, then a replay
        assert not caplog.records
        for step in range(8):
            cache, eager_cache = torch.randn(6, 4, device=device), torch.randn(6, 4, device=device)
            cache.copy_(eager_cache)
            pos = torch.tensor([step % 6], device=device)
            assert torch.equal(fn(cache, pos, x), model(eager_cache, pos, x))
            assert torch.equal(cache, eager_cache)
    graph = only_graph()
    assert graph["recaptures"] == {"mutated input moved": 7}
    assert graph["dropped_keys"] == {"written inputs copied from now on": 1}
    assert (graph["captures"], graph["replays"]) == (9, 1 + 3)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(
        "npugraph_ex: graph[0/0] was captured again on each of its last 4 calls, not replayed: "
        "a tensor it writes in place arrived at a new address every time (it writes tensors of "
        "shapes 6x4), and a capture writes to the address it was captured with."
    )
    assert (
        "From now on this graph copies the tensors it writes into buffers of its own before "
        "each replay and back after it" in said
    )


@torch.no_grad()
def test_a_written_input_new_on_every_call_without_clone_input_stays_a_capture(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Without buffers of its own (clone_input=False) the graph has nowhere to copy to.
    model = KvCache()
    fn = compiled(model, dynamic=False, clone_input=False)
    pos, x = torch.tensor([1]), torch.randn(1, 4)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for _ in range(6):
            cache, eager_cache = torch.zeros(6, 4), torch.zeros(6, 4)
            assert torch.equal(fn(cache, pos, x), model(eager_cache, pos, x))
            assert torch.equal(cache, eager_cache)
    assert only_graph()["recaptures"] == {"mutated input moved": 5}
    (said,) = [r.getMessage() for r in caplog.records]
    assert "Write into one tensor kept across calls" in said


@torch.no_grad()
def test_parameter_at_a_new_address_is_a_new_key(device: str) -> None:
    lin = torch.nn.Linear(4, 3).to(device)
    fn = compiled(lin)
    x = torch.randn(2, 4, device=device)
    fn(x)
    lin.weight.data = torch.randn(3, 4, device=device)
    assert torch.equal(fn(x), lin(x))
    assert totals()["captures"] == 2
    assert totals()["replays"] == 0


@torch.no_grad()
def test_a_key_whose_parameters_were_replaced_and_freed_is_dropped(device: str) -> None:
    lin = torch.nn.Linear(64, 64).to(device)
    fn = compiled(lin)
    x = torch.randn(2, 64, device=device)
    fn(x)
    old_weight = weakref.ref(lin.weight)
    lin.weight = torch.nn.Parameter(torch.randn(64, 64, device=device))
    assert torch.equal(fn(x), lin(x))
    gc.collect()
    assert old_weight() is None  # the first key held it only weakly, and was dropped
    graph = only_graph()
    assert graph["dropped_keys"] == {"parameters replaced": 1}
    assert graph["live_keys"] == 1


@torch.no_grad()
def test_weights_reloaded_through_data_are_not_kept_alive(device: str) -> None:
    # Small enough that no product rewrite takes it: replays are bit-identical to eager.
    lin = torch.nn.Linear(64, 64).to(device)
    fn = compiled(lin)
    x = torch.randn(2, 64, device=device)
    fn(x)
    old_weights = []
    for _ in range(4):
        old_weights.append(StorageWeakRef(lin.weight.untyped_storage()))
        lin.weight.data = torch.randn(64, 64, device=device)  # a weight reload
        assert_same(fn(x), lin(x), device)
        assert_same(fn(x), lin(x), device)  # the new key replays
    gc.collect()
    assert [ref.expired() for ref in old_weights] == [True] * 4
    graph = only_graph()
    assert graph["dropped_keys"] == {"parameters replaced": 4}
    assert (graph["live_keys"], graph["captures"], graph["replays"]) == (1, 5, 4)


@torch.no_grad()
def test_every_key_stages_the_same_alias_of_a_parameter(device: str) -> None:
    lin = torch.nn.Linear(8, 8).to(device)
    before = live_graph_numbers()
    fn = compiled(lin)
    for rows in (2, 3):
        x = torch.randn(rows, 8, device=device)
        assert torch.equal(fn(x), lin(x))
    (manager,) = managers_since(before)
    first, second = (entry.staged.args for entry in manager.entries.values())
    static = manager.layout.static
    assert len(static) == 2  # weight and bias
    assert [first[i] is second[i] for i in static] == [True, True]
    aliases = [first[i] for i in static]
    assert not any(alias is p for alias in aliases for p in lin.parameters())
    assert not any(alias.requires_grad for alias in aliases)


@torch.no_grad()
def test_outputs_are_graph_memory_unless_clone_output(device: str) -> None:
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    shared = compiled(double)
    x = torch.randn(4, device=device)
    address = shared(x).data_ptr()  # dropped at once
    assert shared(x).data_ptr() == address  # the next call rewrites the same memory
    first = shared(x)
    row = first[1:]  # a view the caller made
    second = shared(x + 1)  # the same key again, while the caller holds ``first``
    assert torch.equal(second, (x + 1) * 2)
    # Never the later call's values: on CPU the graph took fresh memory and ``first`` keeps its
    # own; a device graph rewrites fixed memory, so reading ``first`` there is an error.
    if device == "cpu":
        assert torch.equal(first, x * 2) and torch.equal(row, (x * 2)[1:])
    else:
        for held in (first, row):
            with pytest.raises(RuntimeError, match=r"options=\{'clone_output': True\}"):
                held.sum()

    torch._dynamo.reset()
    private = compiled(double, clone_output=True)
    first, second = private(x), private(x + 1)
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first, x * 2)
    assert torch.equal(second, (x + 1) * 2)


@torch.no_grad()
def test_an_output_of_a_released_key_keeps_its_values_while_held(device: str) -> None:
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    fn = compiled(double, force_recapture=True)
    x = torch.randn(4, device=device)
    first = fn(x)
    second = fn(x + 1)  # captured again: the first capture is released, its memory kept
    third = fn(x + 2)
    assert totals()["captures"] == 3
    for output, expected in ((first, x * 2), (second, (x + 1) * 2), (third, (x + 2) * 2)):
        assert torch.equal(output, expected)


@torch.no_grad()
def test_outputs_aliasing_inputs_alias_the_callers_tensor(device: str) -> None:
    def views(x: torch.Tensor):
        return x, x[1], x.view(-1), x + 1

    fn = compiled(views, dynamic=False)
    for _ in range(3):
        x = torch.randn(3, 4, device=device)
        same, row, flat, plus = fn(x)
        assert same is x
        assert row.data_ptr() == x[1].data_ptr()
        assert flat.data_ptr() == x.data_ptr()
        x.fill_(7.0)
        assert torch.equal(row, torch.full((4,), 7.0, device=device))
        assert plus.data_ptr() != x.data_ptr()


@torch.no_grad()
@pytest.mark.parametrize("computes", [False, True], ids=["view only", "view and kernel"])
def test_keys_whose_outputs_view_a_copied_input_replay(device: str, computes: bool) -> None:
    def narrowed(x: torch.Tensor, n: int):
        view = x.narrow(0, n % 3, 2)
        return (view, x.sin() * n) if computes else view

    fn = compiled(narrowed)
    x = torch.arange(-3.0, 3.0, device=device)
    for n in (2, 5, 7, 2, 5, 7):
        assert_trees_equal(fn(x, n), narrowed(x, n))
    graph = only_graph()
    assert (graph["captures"], graph["replays"], graph["failed_calls"]) == (3, 3, {})


@torch.no_grad()
def test_unusual_inputs(device: str) -> None:
    def fn(x, empty, scale, n: int, factor: float):
        return x.t() @ x * scale + n * factor, empty.sum(0), x[:, :n]

    graph = compiled(fn)
    for n in (1, 2, 2):
        x = torch.randn(6, 4, device=device).t()  # non-contiguous
        empty = torch.randn(0, 3, device=device)
        scale = torch.tensor(1.5 + n, device=device)  # 0-d tensor
        got, expected = graph(x, empty, scale, n, 0.5), fn(x, empty, scale, n, 0.5)
        assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
    assert totals()["captures"] == 2
    assert totals()["replays"] == 1


@torch.no_grad()
def test_capture_limit_keeps_replaying_captured_keys(
    device: str, caplog: pytest.LogCaptureFixture
) -> None:
    def fn(x):
        return x.cos() + 1

    graph = compiled(fn, capture_limit=2)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for rows in (2, 3, 4, 5, 2, 3, 4):
            x = torch.randn(rows, 3, device=device)
            assert torch.equal(graph(x), fn(x))
    stats = only_graph()
    assert stats["captures"] == 2
    assert stats["replays"] == 2
    assert stats["eager_calls"] == {"capture_limit": 3}
    limit_warnings = [r for r in caplog.records if "capture_limit=2" in r.getMessage()]
    assert len(limit_warnings) == 1
    assert "options={'capture_limit': N}" in limit_warnings[0].getMessage()


@torch.no_grad()
def test_a_new_graph_warns_at_its_limit_after_an_older_one_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fn(x):
        return x.sin() * 2

    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for _ in range(2):
            graph = compiled(fn, capture_limit=1)
            for rows in (2, 3):
                graph(torch.randn(rows, 3))
            del graph
            torch._dynamo.reset()  # the graph and its capture manager are gone
    limit_warnings = [r for r in caplog.records if "capture_limit=1" in r.getMessage()]
    assert len(limit_warnings) == 2


@torch.no_grad()
def test_force_eager_never_captures(device: str) -> None:
    w, b = torch.randn(8, 16, device=device), torch.randn(16, device=device)
    fn = compiled(mixed_ops, force_eager=True)
    for _ in range(3):
        x = torch.randn(5, 8, device=device)
        assert torch.equal(fn(x, w, b), mixed_ops(x, w, b))
    assert totals()["captures"] == 0
    assert only_graph()["eager_calls"] == {"force_eager": 3}


@torch.no_grad()
def test_force_recapture_captures_every_call(device: str) -> None:
    w, b = torch.randn(8, 16, device=device), torch.randn(16, device=device)
    fn = compiled(mixed_ops, force_recapture=True)
    for _ in range(3):
        x = torch.randn(5, 8, device=device)
        assert torch.equal(fn(x, w, b), mixed_ops(x, w, b))
    stats = only_graph()
    assert stats["captures"] == 3
    assert stats["recaptures"] == {"force_recapture": 2}
    assert stats["replays"] == 0
    assert stats["live_keys"] == 1


def noisy(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand_like(x)  # the random op that blocks a device graph's capture


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@torch.no_grad()
def test_graph_with_random_op_runs_eagerly_on_cuda_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The CPU replay draws random numbers itself (tests/capture/test_random.py).
    fn = compiled(noisy)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        outs = [fn(torch.zeros(3, device="cuda")) for _ in range(3)]
    assert not torch.equal(outs[0], outs[1])  # fresh random numbers every call
    assert totals()["captures"] == 0
    assert only_graph()["eager_calls"] == {"cannot capture": 3}
    reasons = [r.getMessage() for r in caplog.records if "not captured" in r.getMessage()]
    assert len(reasons) == 1
    assert "random-number op" in reasons[0]
    assert "aten.rand" in reasons[0]
    assert "test_contract.py" in reasons[0]
    assert "torch.rand_like(x)" in reasons[0]


@pytest.mark.parametrize(
    ("fn", "config", "reason"),
    [
        (
            lambda x: torch.nonzero(x > 0).sum() + x,
            {"capture_dynamic_output_shape_ops": True},
            "data-dependent output shape: aten.nonzero",
        ),
        (
            lambda x: x * x.sum().int().item(),
            {"capture_scalar_outputs": True},
            "host synchronisation (data-dependent output): aten._local_scalar_dense",
        ),
    ],
    ids=["nonzero", "item"],
)
@torch.no_grad()
def test_data_dependent_graph_runs_eagerly(
    device: str, fn, config: dict, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with torch._dynamo.config.patch(**config):
        graph = compiled(fn)
        with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
            for _ in range(2):
                x = torch.randn(4, device=device)
                assert torch.equal(graph(x), fn(x))
    assert totals()["captures"] == 0
    assert any(reason in r.getMessage() for r in caplog.records)


def test_indexing_with_int_tensors_is_captured(device: str) -> None:
    def gather_rows(x, rows):
        return x[rows] * 2

    fn = compiled(gather_rows)
    with torch.no_grad():
        for _ in range(3):
            x, rows = torch.randn(5, 3, device=device), torch.tensor([4, 0, 2], device=device)
            assert torch.equal(fn(x, rows), gather_rows(x, rows))
    assert totals()["captures"] == 1
    assert totals()["replays"] == 2


@torch.no_grad()
def test_strict_capture_raises_instead_of_falling_back(device: str) -> None:
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        fn = compiled(lambda x: torch.nonzero(x > 0).sum() + x, strict_capture=True)
        with pytest.raises(UnsupportedGraphError, match="data-dependent output shape") as raised:
            fn(torch.zeros(3, device=device))
    assert "options={'strict_capture': False}" in str(raised.value)


@torch.no_grad()
def test_warmup_runs_leave_inputs_as_one_call_would(device: str) -> None:
    def bump(counter: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        counter.add_(1)
        return x * counter

    fn = compiled(bump, dynamic=False, num_warmup_iters=3)
    counter = torch.zeros(1, device=device)
    x = torch.ones(2, device=device)
    assert torch.equal(fn(counter, x), torch.ones(2, device=device))
    assert counter.item() == 1
    assert torch.equal(fn(counter, x), torch.full((2,), 2.0, device=device))
    assert counter.item() == 2
    assert totals()["captures"] == 1


def test_call_needing_grad_runs_without_capture(
    device: str, caplog: pytest.LogCaptureFixture
) -> None:
    lin = torch.nn.Linear(4, 2).to(device)
    fn = compiled(lin)
    x = torch.randn(3, 4, device=device)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        out = fn(x)
        fn(x)
    out.sum().backward()
    assert lin.weight.grad is not None
    assert torch.equal(out, lin(x))
    assert totals()["captures"] == 0
    messages = [r.getMessage() for r in caplog.records if "runs without capture" in r.getMessage()]
    assert len(messages) == 1
    with torch.no_grad():
        fn(x)
        fn(x)
    assert totals()["captures"] == 1
    assert totals()["replays"] == 1


@torch.no_grad()
def test_each_graph_of_a_graph_break_is_captured(device: str) -> None:
    def broken(x):
        y = x.sin() * 2
        torch._dynamo.graph_break()
        return y.cos() + 1

    fn = torch.compile(broken, backend="npugraph_ex")
    for _ in range(3):
        x = torch.randn(4, device=device)
        assert torch.equal(fn(x), broken(x))
    graphs = [g for g in npugraph_ex.stats()["graphs"] if g["captures"]]
    assert len(graphs) == 2
    assert [g["replays"] for g in graphs] == [2, 2]


def test_inference_mode_replays_like_no_grad(device: str) -> None:
    model = KvCache().to(device)
    fn = compiled(model, dynamic=False)
    with torch.inference_mode():
        eager_cache = torch.zeros(6, 4, device=device)
        graph_cache = torch.zeros(6, 4, device=device)
        for step in range(3):
            pos, x = torch.tensor([step], device=device), torch.randn(1, 4, device=device)
            assert torch.equal(fn(graph_cache, pos, x), model(eager_cache, pos, x))
        assert torch.equal(graph_cache, eager_cache)
    assert totals()["replays"] == 2


@torch.no_grad()
def test_a_key_dropped_while_another_call_holds_it_runs_that_call_eagerly() -> None:
    # Two threads: one call finds a key, another drops it (its parameters were replaced)
    # before the first replays: the first runs eagerly instead of replaying a released graph.
    before = live_graph_numbers()
    fn = torch.compile(lambda x: x.sin() + 1, backend="npugraph_ex")
    x = torch.randn(4)
    fn(x)
    (manager,) = managers_since(before)
    (key,) = manager.entries
    entry = manager.entries.pop(key)
    manager.release_entry(entry)
    (out,) = manager.replay(entry, [x])
    assert torch.equal(out, x.sin() + 1)
    (graph,) = graphs_called()
    assert graph["eager_calls"] == {"key dropped by another call": 1}


@torch.no_grad()
def test_threads_calling_new_shapes_at_once_capture_no_more_than_the_limit() -> None:
    import threading

    fn = torch.compile(
        lambda x: x * 2 + 1, backend="npugraph_ex", dynamic=True, options={"capture_limit": 2}
    )
    fn(torch.randn(9))  # compiled and a first key captured before the threads start
    barrier = threading.Barrier(6)
    failures = []

    def call(length: int) -> None:
        barrier.wait()
        x = torch.randn(length)
        with torch.no_grad():  # grad mode is per thread
            if not torch.equal(fn(x), x * 2 + 1):
                failures.append(length)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(2, 8)]
    # Torch 2.11 sets and reverts ``dynamic=True``'s ``assume_static_by_default=False`` for the
    # whole process, not per thread: calls racing on threads can leave it set, and every later
    # compile in the process dynamic. The patch puts it back.
    with torch._dynamo.config.patch(assume_static_by_default=True):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    (graph,) = graphs_called()
    assert not failures and graph["captures"] == 2
    assert graph["eager_calls"] == {"capture_limit": 5}
