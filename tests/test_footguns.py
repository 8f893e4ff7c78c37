"""Surprising semantics of capture and replay, shown on purpose.

Each test states a behaviour that follows from replaying fixed memory, so that nobody mistakes it
for a bug and nobody changes it by accident.
"""

from __future__ import annotations

import logging

import pytest
import torch

import npugraph_ex
from npugraph_ex.errors import CaptureError


def compiled(fn, dynamic: bool = False, **options):
    return torch.compile(
        fn, backend="npugraph_ex", fullgraph=True, dynamic=dynamic, options=options or None
    )


@torch.no_grad()
def test_an_output_is_the_graphs_memory_until_the_next_call_of_its_shapes() -> None:
    fn = compiled(lambda x: x * 2)
    fn(torch.ones(3))  # captured
    address = fn(torch.ones(3)).data_ptr()  # dropped at once: the next call may reuse it
    held = fn(torch.full((3,), 5.0))
    assert held.data_ptr() == address  # no allocation while the caller drops each output
    fn(torch.ones(3))
    # Held across the next call, it keeps its values: the graph took fresh memory instead.
    assert torch.equal(held, torch.full((3,), 10.0))


@torch.no_grad()
def test_without_the_pool_an_output_is_overwritten_by_the_next_call() -> None:
    fn = compiled(lambda x: x * 2, disabled_build_steps=("place",))
    first = fn(torch.ones(3))
    fn(torch.full((3,), 5.0))
    # Without the pool's output slots there is no fresh memory to take: ``first`` was rewritten.
    assert torch.equal(first, torch.full((3,), 10.0))
    kept = fn(torch.ones(3)).clone()  # clone what must survive the next call
    fn(torch.zeros(3))
    assert torch.equal(kept, torch.full((3,), 2.0))


@torch.no_grad()
def test_a_call_with_other_shapes_leaves_a_held_output_alone() -> None:
    fn = compiled(lambda x: x * 2, dynamic=True)
    short = fn(torch.ones(3))
    long = fn(torch.ones(5))  # another key, drawing from the same pool
    fn(torch.full((7,), 3.0))
    # Only a call with the same shapes may reuse an output's memory; these keep their values.
    assert torch.equal(short, torch.full((3,), 2.0))
    assert torch.equal(long, torch.full((5,), 2.0))


@torch.no_grad()
def test_frozen_parameter_does_not_notice_a_moved_parameter() -> None:
    lin = torch.nn.Linear(2, 2, bias=False)
    old_weight = lin.weight.detach().clone()
    fn = compiled(lin, frozen_parameter=True)
    x = torch.ones(1, 2)
    fn(x)
    lin.weight.data = torch.zeros(2, 2)  # new address: frozen_parameter promised this never happens
    assert torch.equal(fn(x), x @ old_weight.t())  # still reads the memory captured first
    assert npugraph_ex.stats()["totals"]["captures"] == 1


@torch.no_grad()
def test_the_debug_check_catches_a_moved_frozen_parameter(caplog: pytest.LogCaptureFixture) -> None:
    lin = torch.nn.Linear(2, 2, bias=False)
    fn = compiled(lin, frozen_parameter=True)
    x = torch.ones(1, 2)
    fn(x)
    lin.weight.data = torch.zeros(2, 2)
    with caplog.at_level(logging.DEBUG, logger="npugraph_ex"):
        with pytest.raises(CaptureError, match=r"moved since key0.*frozen_parameter=True") as error:
            fn(x)
    assert "options={'frozen_parameter': False}" in str(error.value)
    assert "param.copy_(new)" in str(error.value)


@torch.no_grad()
def test_parameter_values_changed_in_place_are_seen() -> None:
    lin = torch.nn.Linear(2, 2, bias=False)
    fn = compiled(lin, frozen_parameter=True)
    x = torch.ones(1, 2)
    fn(x)
    lin.weight.fill_(1.0)  # same address, new values: replays read them
    assert torch.equal(fn(x), torch.full((1, 2), 2.0))


@torch.no_grad()
def test_without_clone_input_the_first_input_becomes_the_static_buffer() -> None:
    fn = compiled(lambda x: x + 1, clone_input=False)
    first = torch.zeros(3)
    fn(first)
    fn(torch.full((3,), 4.0))
    # The second call's input was copied into the first call's tensor.
    assert torch.equal(first, torch.full((3,), 4.0))


@torch.no_grad()
def test_an_int_a_kernel_takes_as_an_int_is_a_capture_per_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def shift(x: torch.Tensor, step: int) -> torch.Tensor:
        return torch.roll(x, step)

    fn = compiled(shift, dynamic=True)
    x = torch.arange(4.0)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for step in range(2, 7):
            assert torch.equal(fn(x, step), torch.roll(x, step))
    # roll takes its shifts as ints, which the captured kernel holds as constants: each value is
    # a new graph key; the fourth such key makes the graph say so, once. (An int that is only
    # added to or multiplied with tensors does not cost this: see test_split_host_ints.py.)
    assert npugraph_ex.stats()["totals"]["captures"] == 5
    (notice,) = [r.getMessage() for r in caplog.records]
    assert "has captured 4 keys that differ only in the values of its int inputs" in notice
    # Each key's values: x's size (a symbolic int under dynamic=True), then ``step``.
    assert "(values=[4, 2]; values=[4, 3]; values=[4, 4]; values=[4, 5])" in notice
    fn(x, 3)  # a value seen before replays
    assert npugraph_ex.stats()["totals"]["replays"] == 1


@torch.no_grad()
def test_a_graph_break_inside_a_scope_runs_the_whole_function_eagerly() -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        with npugraph_ex.scope.limit_core_num(1, 1):
            y = x.sin()
            torch._dynamo.graph_break()
            return y.cos()

    fn = torch.compile(broken, backend="npugraph_ex")
    x = torch.randn(4)
    for _ in range(2):
        assert torch.equal(fn(x), x.sin().cos())
    # Dynamo cannot resume a graph inside a user context manager, so it gives up on the frame:
    # right results, the block still applied, but nothing is captured. Keep graph breaks out of
    # scopes (fullgraph=True makes one an error).
    totals = npugraph_ex.stats()["totals"]
    assert (totals["captures"], totals["replays"], totals["eager_calls"]) == (0, 0, 0)
    torch._dynamo.reset()  # forget that Dynamo gave up on the frame
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(broken, backend="npugraph_ex", fullgraph=True)(x)


class Scaled(torch.nn.Module):
    """A linear layer times a float the module holds (as a norm holds its eps)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2, bias=False)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


@torch.no_grad()
def test_with_module_guards_filtered_out_module_state_changes_go_unseen() -> None:
    model = Scaled()
    options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    fn = torch.compile(model, backend="npugraph_ex", fullgraph=True, options=options)
    x = torch.ones(1, 2)
    fn(x)
    # Dynamo no longer checks the modules' attributes: the float the graph was traced with stays.
    model.scale = 3.0
    assert torch.equal(fn(x), model.lin(x) * 2.0)
    # A parameter is still read from the module on every call and its address is in the graph
    # key (without frozen_parameter), so a new one is captured, not missed.
    model.lin.weight = torch.nn.Parameter(torch.ones(2, 2))
    assert torch.equal(fn(x), torch.full((1, 2), 4.0))
    assert npugraph_ex.stats()["totals"]["captures"] == 2
