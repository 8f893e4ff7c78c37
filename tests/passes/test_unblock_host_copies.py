"""Copies of host scalar inputs made non-blocking (the ``unblock_host_copies`` pass), read from
graphs traced on fake CUDA tensors: a blocking copy from the host synchronises the capturing
stream, which invalidates a capture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from npugraph_ex.config import Config
from npugraph_ex.passes.manager import PassManager
from npugraph_ex.passes.pipeline import PIPELINE


def on_cuda(fn: Callable[..., torch.Tensor]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``fn(x, host)`` traced on a fake CUDA tensor and a 0-d CPU one."""
    with FakeTensorMode():
        x = torch.empty(4, 3, device="cuda")
        host = torch.empty((), dtype=torch.int64)
    return make_fx(fn, tracing_mode="fake")(x, host), [x, host]


def copies_the_host_scalar_input(x: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    return x * (host.to(x.device) + 1)


def non_blocking(gm: torch.fx.GraphModule) -> list[bool]:
    copies = gm.graph.find_nodes(op="call_function", target=torch.ops.aten._to_copy.default)
    return [c.kwargs.get("non_blocking", False) for c in copies]


def passes(options: dict[str, Any] | None = None) -> PassManager:
    return PassManager(PIPELINE, Config.from_options(options))


def test_a_copy_of_a_host_scalar_input_does_not_block() -> None:
    gm, inputs = on_cuda(copies_the_host_scalar_input)
    assert non_blocking(gm) == [False]
    gm = passes()(gm, inputs)
    assert non_blocking(gm) == [True]
    assert "non_blocking = True" in gm.code


def test_turned_off_by_name_the_copy_blocks() -> None:
    gm, inputs = on_cuda(copies_the_host_scalar_input)
    gm = passes({"disabled_passes": ["unblock_host_copies"]})(gm, inputs)
    assert non_blocking(gm) == [False]


def test_other_copies_block_as_written() -> None:
    def copies_device_data_to_the_host(x: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
        return x.to("cpu") * host

    gm, inputs = on_cuda(copies_device_data_to_the_host)
    assert non_blocking(passes()(gm, inputs)) == [False]

    def casts_the_host_scalar(x: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
        return x * host.to(torch.float32)

    x, host = torch.randn(4, 3), torch.tensor(2)
    gm = passes()(make_fx(casts_the_host_scalar)(x, host), [x, host])
    assert non_blocking(gm) == [False]  # a graph on the host: nothing to capture on a device


def test_it_runs_before_the_graph_inputs_change() -> None:
    names = [p.name for p in PIPELINE]
    assert names[-2:] == ["unblock_host_copies", "split_host_ints"]
