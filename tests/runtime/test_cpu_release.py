"""A capture frees each intermediate's bytes once no later node reads it, and keeps the rest."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import captured_on_cpu
from npugraph_ex.runtime import runtime_for
from npugraph_ex.runtime.base import Program
from npugraph_ex.runtime.cpu.recorder import KernelRecorder
from npugraph_ex.runtime.cpu.release import Releaser, ReleasingRun


def chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(6):
        x = (x * 2).relu() + 1
    return x


class MostPending(ReleasingRun):
    """Notes the most bytes the capture held in storages it allocated, after any node."""

    most = 0

    def run_node(self, n: torch.fx.Node):
        value = super().run_node(n)
        held = sum(s.nbytes() for s in self.releaser.pending.values())
        self.most = max(self.most, held)
        return value


def test_a_chain_holds_two_intermediates_at_a_time_while_it_is_captured() -> None:
    x = torch.randn(64, 64)
    gm = make_fx(chain)(x)
    recorder = KernelRecorder()
    recorder.releaser = Releaser()
    run = MostPending(gm, recorder.releaser)
    with torch.no_grad(), recorder:
        out = run.run(x)
    buffer = 64 * 64 * 4
    assert torch.equal(out, chain(x))
    assert run.most == 2 * buffer  # not 18 buffers: one per kernel
    assert sorted(recorder.releaser.released.values()) == [buffer] * 17
    assert list(recorder.releaser.pending.values())[0].nbytes() == buffer  # the output's


def view_outlives_its_base(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x * 2
    rows = a[1:]  # a view of a
    total = a.sum()  # the last node that reads a itself
    other = (x + 1) * 3  # work that could reuse a's bytes
    return rows * total + other[1:], w[0] + 1


def test_a_storage_stays_while_a_view_of_it_is_alive_and_inputs_are_never_freed() -> None:
    x, w = torch.randn(6, 5), torch.randn(3, 5)
    captured = captured_on_cpu(view_outlives_its_base, x, w)
    graph = captured.graph
    for got, want in zip(captured.outputs, view_outlives_its_base(x, w), strict=True):
        assert torch.equal(got, want)
    assert x.untyped_storage().nbytes() == 6 * 5 * 4
    assert w.untyped_storage().nbytes() == 3 * 5 * 4
    for _ in range(3):
        x.copy_(torch.randn(6, 5))
        for got, want in zip(graph.replay(), view_outlives_its_base(x, w), strict=True):
            assert torch.equal(got, want)


TABLE = torch.arange(12.0).reshape(3, 4)


def with_a_constant(x: torch.Tensor) -> torch.Tensor:
    return (x * 2 + TABLE[1:]).relu()  # TABLE is traced as a constant of the graph


def test_a_graph_constant_is_never_freed() -> None:
    x = torch.randn(2, 4)
    gm = make_fx(with_a_constant)(x)
    graph = runtime_for("cpu").capture(Program(gm), [x], None).graph
    constants = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    assert len(constants) == 1 and constants[0].untyped_storage().nbytes() == 12 * 4
    x.copy_(torch.randn(2, 4))
    assert torch.equal(graph.replay()[0], with_a_constant(x))


@torch.library.custom_op("npugraph_ex_release_test::later", mutates_args=())
def later(x: torch.Tensor) -> torch.Tensor:
    """Stands for an op that may still read its input after it returns (a collective does)."""
    return x + 1


@later.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def through_an_op_outside_aten(x: torch.Tensor) -> torch.Tensor:
    given = x * 2
    return later(given) * 3


def test_what_an_op_outside_aten_was_given_is_never_freed() -> None:
    x = torch.randn(8, 8)
    gm = make_fx(through_an_op_outside_aten)(x)
    recorder = KernelRecorder()
    recorder.releaser = Releaser()
    with torch.no_grad(), recorder:
        out = ReleasingRun(gm, recorder.releaser).run(x)
    assert torch.equal(out, through_an_op_outside_aten(x))
    # later's result is freed once read; x * 2, which later was given, is not.
    assert list(recorder.releaser.released.values()) == [8 * 8 * 4]
    assert len(recorder.releaser.pinned) == 1  # x * 2
