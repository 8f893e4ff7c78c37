"""``static_kernel_compile="background"``: hot keys get compiled kernels from a worker process,
swapped in at a call boundary and kept only where faster.

Each swap waits for a real Inductor compile in a worker (seconds on small machines), so the
graphs here are tiny and share one Inductor cache directory across the tests."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import pytest
import torch

import npugraph_ex
from helpers import ANY_SPEED, graphs_called
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.kernels.cores import background_cores, serving_threads, usable_cores
from npugraph_ex.kernels.processes import PROCESSES

SETTLE_SECONDS = 120


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))


def compiled(
    model: torch.nn.Module, dynamic: bool | None = None, **options: object
) -> Callable[..., torch.Tensor]:
    options = {"static_kernel_compile": "background", "background_compile_after": 2, **options}
    return torch.compile(model, backend="npugraph_ex", dynamic=dynamic, options=options)


def compiling_in_a_new_worker(
    model: torch.nn.Module, **options: object
) -> Callable[..., torch.Tensor]:
    """``model`` compiled, called until its key is hot, its compile sent to a new worker: one
    that takes seconds to start, so the compile is surely still in flight after the call."""
    fn = compiled(model, background_compile_after=1, **options)
    x = torch.randn(4, 32)
    fn(x)
    PROCESSES.shutdown()
    fn(x)  # hot: the compile starts
    return fn


def tiers() -> dict[str, int]:
    (graph,) = graphs_called()
    return graph["background"]


def call_until_settled(
    fn: Callable[..., torch.Tensor],
    model: torch.nn.Module,
    device: str = "cpu",
    inputs: Callable[[], torch.Tensor] | None = None,
) -> int:
    """Call with new inputs (``inputs()``, else 4 x 32) until the keys leave ATen or the trial,
    checking every result against eager; the calls made."""
    deadline = time.monotonic() + SETTLE_SECONDS
    calls = 0
    while time.monotonic() < deadline:
        x = inputs() if inputs is not None else torch.randn(4, 32, device=device)
        torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
        calls += 1
        if not {"aten", "queued", "pending", "trial"} & set(tiers()):
            return calls
        time.sleep(0.01)
    raise AssertionError(f"no decision after {SETTLE_SECONDS} s: {tiers()}")


@torch.no_grad()
def test_a_hot_key_swaps_in_its_kernels_with_eagers_results() -> None:
    model = mlp()
    fn = compiled(model, background_min_gain=ANY_SPEED)
    x = torch.randn(4, 32)
    fn(x)
    assert tiers() == {"aten": 1}  # the first calls replay ATen kernels
    calls = call_until_settled(fn, model)
    (graph,) = graphs_called()
    assert graph["background"] == {"kernels": 1}, graph["background"]
    assert graph["captures"] == 1 and graph["eager_calls"] == {}
    assert calls >= 2 * 5  # the trial ran both forms on real calls
    (key,) = graph["keys"].values()
    assert key["pool_bytes"] == 0  # the ATen graph's memory is gone with it


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@torch.no_grad()
def test_on_cuda_both_forms_read_the_inputs_of_each_call_through_the_trial() -> None:
    # Each form is a CUDA graph reading the key's input buffers where its capture found them:
    # capturing the kernels must not move the buffers the ATen graph reads (its trial calls
    # would see stale inputs).
    model = mlp().cuda()
    fn = compiled(model, background_min_gain=ANY_SPEED)
    calls = call_until_settled(fn, model, device="cuda")
    assert tiers() == {"kernels": 1}
    assert calls >= 2 * 5


@torch.no_grad()
def test_kernels_not_faster_by_the_gain_asked_keep_the_aten_replay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = mlp()
    fn = compiled(model, background_min_gain=1000.0)
    with caplog.at_level(logging.INFO, logger="npugraph_ex"):
        call_until_settled(fn, model)
    assert tiers() == {"aten kept: slower": 1}
    (graph,) = graphs_called()
    (key,) = graph["keys"].values()
    assert key["kernels"] > 0  # the ATen replay's steps
    assert any("background kernels slower" in r.getMessage() for r in caplog.records)


@torch.no_grad()
def test_a_killed_worker_leaves_the_aten_replay_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = mlp()
    fn = compiling_in_a_new_worker(model)
    assert tiers() == {"pending": 1}
    PROCESSES.shutdown()  # kills the worker mid-compile
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        call_until_settled(fn, model)
        call_until_settled(fn, model)
    assert tiers() == {"aten kept: failed": 1}
    said = [r.getMessage() for r in caplog.records if "background kernels failed" in r.getMessage()]
    assert len(said) == 1 and "the compile worker process exited" in said[0]


@torch.no_grad()
def test_a_worker_killed_while_its_kernels_load_leaves_them_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The reply's bytes are the serving process's once they arrive: the worker's death after
    # it answered (here, before the serving thread's next call loads them) changes nothing.
    model = mlp()
    fn = compiling_in_a_new_worker(model, background_min_gain=ANY_SPEED)
    (worker,) = PROCESSES.processes
    deadline = time.monotonic() + SETTLE_SECONDS
    while worker.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not worker.busy and tiers() == {"pending": 1}  # answered; loading is a call's
    worker.process.kill()
    worker.process.wait()
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        call_until_settled(fn, model)
    assert tiers() == {"kernels": 1}
    assert not [r for r in caplog.records if "background kernels" in r.getMessage()]


@pytest.mark.parametrize("through_data", [False, True], ids=["in place", "through .data"])
@torch.no_grad()
def test_weights_reloaded_while_their_compile_runs_serve_from_the_swapped_kernels(
    through_data: bool,
) -> None:
    # The compile was sent with the old weights' graph; the kernels it returns take the
    # weights as arguments, so after the swap they compute with the new ones.
    model = mlp()
    fn = compiling_in_a_new_worker(model, background_min_gain=ANY_SPEED)
    assert tiers() == {"pending": 1}
    for parameter in model.parameters():
        new = torch.rand_like(parameter) * 0.2 - 0.1  # as ``nn.Linear`` draws them
        if through_data:
            parameter.data = new
        else:
            parameter.copy_(new)
    call_until_settled(fn, model)  # every call against eager with the new weights
    assert tiers() == {"kernels": 1}
    x = torch.randn(4, 32)
    torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_a_compile_past_its_time_limit_is_killed_and_the_next_gets_a_new_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = mlp()
    PROCESSES.shutdown()
    # A new worker takes seconds to start: 50 ms is surely too little for its compile.
    fn = compiled(model, background_compile_after=1, background_compile_seconds=0.05)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        call_until_settled(fn, model)
        call_until_settled(fn, model)
    assert tiers() == {"aten kept: failed": 1}
    said = [r.getMessage() for r in caplog.records if "background kernels failed" in r.getMessage()]
    assert len(said) == 1, said
    assert "the compile took more than 0.05 s: its process was killed" in said[0]
    killed = [p.process for p in PROCESSES.processes]
    assert all(process.poll() is not None for process in killed)
    # The next compile, with time enough, gets a new worker and its kernels.
    npugraph_ex.reset_stats()
    other_model = mlp()
    other = compiled(other_model, background_min_gain=ANY_SPEED)
    call_until_settled(other, other_model)
    assert tiers() == {"kernels": 1}
    assert any(p.alive and p.process not in killed for p in PROCESSES.processes)


@torch.no_grad()
def test_many_compiled_functions_share_one_compile_process_and_outlive_its_death() -> None:
    # One function settles; its idle compile process is killed between compiles; two more go
    # hot together: compiles in flight are bounded per process (default 1), not per graph,
    # and the next compile starts a new process.
    PROCESSES.shutdown()
    models = [torch.nn.Linear(16 * (i + 1), 8) for i in range(3)]
    fns = [compiled(m, background_min_gain=ANY_SPEED) for m in models]
    call_until_settled(fns[0], models[0], inputs=lambda: torch.randn(4, 16))
    (first,) = [p.process for p in PROCESSES.processes]
    first.kill()
    first.wait()
    most_alive = 0
    deadline = time.monotonic() + 2 * SETTLE_SECONDS
    while time.monotonic() < deadline:
        for model, fn in zip(models[1:], fns[1:], strict=True):
            x = torch.randn(4, model.in_features)
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
        most_alive = max(most_alive, sum(p.alive for p in PROCESSES.processes))
        if all(set(g["background"]) == {"kernels"} for g in graphs_called()):
            break
        time.sleep(0.01)
    assert [set(g["background"]) for g in graphs_called()] == [{"kernels"}] * 3
    assert most_alive == 1
    assert [p.process.pid != first.pid for p in PROCESSES.processes] == [True]


@torch.no_grad()
def test_keys_past_the_capture_limit_are_never_queued() -> None:
    model = mlp()
    fn = compiled(model, dynamic=True, capture_limit=1, background_compile_after=10**6)
    for rows in (2, 3, 3, 2):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(fn(x), model(x))
    (graph,) = graphs_called()
    assert graph["background"] == {"aten": 1}  # one key; the other runs eagerly, unqueued
    assert graph["eager_calls"] == {"capture_limit": 2}


@torch.no_grad()
def test_keys_not_chosen_by_sym_values_never_compile() -> None:
    model = mlp()
    fn = compiled(model, dynamic=True, _vllm_aclnn_static_kernel_sym_range=[8])
    x = torch.randn(4, 32)
    for _ in range(3):
        torch.testing.assert_close(fn(x), model(x))
    assert tiers() == {"aten kept: not chosen": 1}


EXITS_WITH_A_COMPILE_IN_FLIGHT = """
import time, torch
model = torch.nn.Linear(32, 32)
fn = torch.compile(model, backend="npugraph_ex",
                   options={"static_kernel_compile": "background", "background_compile_after": 1})
with torch.no_grad():
    for _ in range(3):
        fn(torch.randn(4, 32))
from npugraph_ex.kernels.processes import PROCESSES
from npugraph_ex.kernels.cores import background_cores, serving_threads, usable_cores
print(*[p.process.pid for p in PROCESSES.processes])
"""


def test_the_process_exits_cleanly_with_a_compile_in_flight() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXITS_WITH_A_COMPILE_IN_FLIGHT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - started < 60
    (pid,) = map(int, done.stdout.split())
    alive = subprocess.run(["kill", "-0", str(pid)], capture_output=True, check=False)
    assert alive.returncode != 0  # the worker went with its process


@torch.no_grad()
def test_a_key_captured_again_reuses_its_kernels() -> None:
    def accumulate(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        total.add_(x.relu())
        return total * 2

    before = live_graph_numbers()
    fn = compiled(accumulate, background_compile_after=1, background_min_gain=ANY_SPEED)
    total = torch.zeros(4, 8)
    x = torch.randn(4, 8)
    deadline = time.monotonic() + SETTLE_SECONDS
    fn(x, total)
    while "kernels" not in tiers() and time.monotonic() < deadline:
        fn(x, total)
    assert tiers() == {"kernels": 1}
    moved = total.clone()  # the written input at a new address: the key is captured again
    expected = (moved + x.relu()) * 2
    torch.testing.assert_close(fn(x, moved), expected)
    while "kernels" not in tiers() and time.monotonic() < deadline:
        fn(x, moved)
    (graph,) = graphs_called()
    assert graph["recaptures"] == {"mutated input moved": 1}
    assert graph["background"] == {"kernels": 1}
    (manager,) = managers_since(before)
    assert manager.programs.kernels.sent == 1


@torch.no_grad()
def test_one_symbolic_compile_serves_every_key_of_a_dynamic_graph() -> None:
    model = mlp()
    before = live_graph_numbers()
    fn = compiled(model, dynamic=True, background_min_gain=ANY_SPEED)
    rows = range(3, 9)
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        for n in rows:
            x = torch.randn(n, 32)
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
        if not {"aten", "queued", "pending", "trial"} & set(tiers()):
            break
        time.sleep(0.01)
    assert tiers() == {"kernels": len(rows)}
    (manager,) = managers_since(before)
    assert manager.programs.kernels.sent == 1  # not one per key
    (graph,) = graphs_called()
    assert graph["captures"] == len(rows) and graph["eager_calls"] == {}


@torch.no_grad()
def test_a_failed_symbolic_compile_leaves_each_key_a_compile_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = mlp()
    before = live_graph_numbers()
    fn = compiled(model, dynamic=True, background_min_gain=ANY_SPEED)
    fn(torch.randn(3, 32))
    (manager,) = managers_since(before)
    background = manager.programs.kernels
    assert background.symbolic is not None
    background.symbolic = [("tensor", ("s99",), ("1",))]  # a spec the worker cannot use
    deadline = time.monotonic() + SETTLE_SECONDS
    with caplog.at_level(logging.INFO, logger="npugraph_ex"):
        while time.monotonic() < deadline:
            for n in (3, 4):
                x = torch.randn(n, 32)
                torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
            if not {"aten", "queued", "pending", "trial"} & set(tiers()):
                break
            time.sleep(0.01)
    assert tiers() == {"kernels": 2}
    assert background.sent == 3  # the failed shared one, then one per key
    assert any("keys compile one by one" in r.getMessage() for r in caplog.records)


def test_a_symbolic_compile_returns_the_guards_its_keys_must_pass() -> None:
    from npugraph_ex.kernels.graph_bytes import pickle_graph
    from npugraph_ex.kernels.remote_compile import compile_in_worker, input_specs
    from npugraph_ex.kernels.symbolic import guards_hold, symbolic_specs

    gm, args = traced_dynamic_mlp()
    symbolic = symbolic_specs(gm)
    assert symbolic is not None
    assert [spec[0] for spec in symbolic] == ["symint", "tensor"] + ["static"] * 4
    assert symbolic[1][1] == (symbolic[0][1], 32)  # the rows are the int input's symbol
    _, guards, _ = compile_in_worker(pickle_graph(gm), input_specs(args), "cpu", True, symbolic)
    assert guards is not None and "L['t" in guards
    assert guards_hold(guards, args)
    assert not guards_hold("L['t0'] > 100", args)
    assert guards_hold(None, args)


def traced_dynamic_mlp() -> tuple[torch.fx.GraphModule, list[object]]:
    """The mlp's ATen graph with a symbolic row count (placeholders carry fake values), and
    inputs for 5 rows in its placeholders' order."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    model = mlp()
    params = [p.detach() for p in model.parameters()]
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    rows = fake_mode.shape_env.create_symintnode(
        fake_mode.shape_env.create_symbol(5, ConstantSource("rows"), DimDynamic.DYNAMIC), hint=5
    )

    def forward(n: int, x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor]:
        return (
            torch.func.functional_call(
                model, dict(zip(dict(model.named_parameters()), weights, strict=True)), (x,)
            ),
        )

    with fake_mode:
        x = torch.empty(rows, 32)
        fake_params = [fake_mode.from_tensor(p, static_shapes=True) for p in params]
        gm = make_fx(forward, tracing_mode="real")(rows, x, *fake_params)
    return gm, [5, torch.randn(5, 32), *params]


def test_a_static_graph_has_no_symbolic_compile() -> None:
    from npugraph_ex.kernels.symbolic import symbolic_specs

    gm = torch.fx.symbolic_trace(mlp())
    assert symbolic_specs(gm) is None


@pytest.mark.skipif(len(usable_cores()) < 2, reason="needs two cores")
@torch.no_grad()
def test_background_work_runs_on_its_own_core_and_replays_leave_it_free() -> None:
    from torch._dynamo.utils import counters

    cores = usable_cores()
    threads = torch.get_num_threads()
    model = mlp()
    fn = compiling_in_a_new_worker(model)
    traced = counters["stats"]["unique_graphs"]
    assert PROCESSES.in_flight == 1
    (worker,) = [p for p in PROCESSES.processes if p.alive]
    deadline = time.monotonic() + 30  # the process pins itself as it starts
    while os.sched_getaffinity(worker.process.pid) != {cores[-1]} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.sched_getaffinity(worker.process.pid) == {cores[-1]}
    with serving_threads(1):
        assert torch.get_num_threads() == min(threads, len(cores) - 1)
    assert torch.get_num_threads() == threads
    call_until_settled(fn, model)
    assert PROCESSES.in_flight == 0 and torch.get_num_threads() == threads
    assert counters["stats"]["unique_graphs"] == traced  # no compile again for the count


def test_no_core_is_set_aside_when_asked_for_none() -> None:
    assert background_cores(0) == set()
    threads = torch.get_num_threads()
    with serving_threads(0):
        assert torch.get_num_threads() == threads


def joined(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x.relu(), x.sigmoid()], dim=1) * 2


def lowered_joined() -> tuple[object, object]:
    """``joined`` compiled for the background tier and called once (never hot): its capture
    manager, and the ``cat`` op ``remove_cat_ops`` takes out of a captured graph."""
    before = live_graph_numbers()
    fn = compiled(joined, background_compile_after=10**6)
    x = torch.randn(4, 8)
    torch.testing.assert_close(fn(x), joined(x))
    (manager,) = managers_since(before)
    return manager, torch.ops.aten.cat.default


@torch.no_grad()
def test_the_aten_replay_runs_the_capture_passes_and_the_worker_gets_the_graph_without() -> None:
    manager, cat = lowered_joined()
    assert not manager.fn.graph.find_nodes(op="call_function", target=cat)  # remove_cat_ops
    assert manager.programs.kernels.gm.graph.find_nodes(op="call_function", target=cat)


@torch.no_grad()
def test_both_lowerings_share_the_passes_before_they_part() -> None:
    ran: list[str] = []

    def pre(gm: torch.fx.GraphModule, example_inputs: object, config: object) -> None:
        ran.append("pre")

    def post(gm: torch.fx.GraphModule, example_inputs: object, config: object) -> None:
        ran.append("post")

    model = mlp()
    options = {"post_grad_custom_pre_pass": pre, "post_grad_custom_post_pass": post}
    fn = compiled(model, background_compile_after=10**6, **options)
    x = torch.randn(4, 32)
    torch.testing.assert_close(fn(x), model(x))
    assert ran == ["pre", "post", "post"]  # the shared part once, the rest per lowering


@torch.no_grad()
def test_a_graph_that_cannot_be_sent_leaves_the_aten_replay_and_frees_the_cores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = mlp()
    before = live_graph_numbers()
    fn = compiled(model, background_compile_after=1)
    x = torch.randn(4, 32)
    fn(x)  # the first capture makes the graph's bytes; here, as if they could not be made
    (manager,) = managers_since(before)
    tier = manager.programs.kernels
    tier.graph, tier.unsendable = None, "the graph cannot be sent: TypeError: cannot pickle"
    threads = torch.get_num_threads()
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        call_until_settled(fn, model)
    assert tiers() == {"aten kept: failed": 1}
    assert PROCESSES.in_flight == 0 and torch.get_num_threads() == threads
    assert any("cannot pickle" in r.getMessage() for r in caplog.records)


@torch.no_grad()
def test_lowerings_called_differently_leave_the_one_for_inductor_serving_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import npugraph_ex.compiler

    monkeypatch.setattr(npugraph_ex.compiler, "same_calls", lambda a, b: False)
    manager, cat = lowered_joined()
    assert manager.fn.graph.find_nodes(op="call_function", target=cat)  # no remove_cat_ops
    assert manager.programs.kernels.gm is manager.fn
