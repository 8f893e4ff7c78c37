"""Which CPU work a device graph may hold (``analysis.host_side_hazard``), read from graphs traced
on fake CUDA tensors: CPU ops run once while a device graph is captured, never on replay."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from npugraph_ex.capture.analysis import analyse_graph


def facts_of(fn: Callable[..., torch.Tensor]):
    """The facts of ``fn(x, host)`` traced on a fake CUDA tensor and a 0-d CPU one."""
    with FakeTensorMode():
        x = torch.empty(4, 3, device="cuda")
        host = torch.empty((), dtype=torch.int64)
    gm = make_fx(fn, tracing_mode="fake")(x, host)
    return analyse_graph(gm, [x, host], static_indices=())


def scaled_by_a_cpu_scalar(x, host):
    return x * torch.scalar_tensor(2.0)


def copies_the_host_scalar_input(x, host):
    return x * (host.to(x.device) + 1)


def test_key_constant_cpu_work_is_captured() -> None:
    # A 0-d CPU tensor the kernel reads as a scalar, and a copy of a host scalar input (its value
    # is in the key; it is staged in pinned memory): constants of each capture.
    for fn in (scaled_by_a_cpu_scalar, copies_the_host_scalar_input):
        facts = facts_of(fn)
        assert (facts.device_type, facts.host_scalar_indices, facts.blocker) == (
            "cuda",
            frozenset({1}),
            None,
        )


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        pytest.param(lambda x, host: x.sum().cpu() + host, "device-to-host copy", id="to-host"),
        pytest.param(
            lambda x, host: x + (host + 1).to(x.device),
            "host-to-device copy of a tensor made on the CPU inside the graph",
            id="cpu-made-copied",
        ),
    ],
)
def test_cpu_work_a_replay_would_get_wrong_is_refused(fn, reason: str) -> None:
    assert facts_of(fn).blocker.startswith(f"{reason}: aten.")


def test_a_write_to_a_cpu_input_is_refused() -> None:
    def counts_on_the_host(x, host):
        host.add_(1)
        return x * 2

    facts = facts_of(counts_on_the_host)
    assert facts.blocker == "the graph writes CPU tensor input host_1, which a replay would not"
