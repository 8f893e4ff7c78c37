"""The CPU engine's build: named steps in one order, switched from ``Config``, one program a
key."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from helpers import capture_on_cpu as capture
from npugraph_ex.config import Config
from npugraph_ex.errors import ConfigError
from npugraph_ex.option_checks import BUILD_STEPS as CHECKED_STEPS
from npugraph_ex.runtime.cpu.build import BUILD_STEPS, SWITCHABLE
from npugraph_ex.runtime.cpu.graph import RELEASED
from npugraph_ex.runtime.cpu.pool import CpuPool


def masked_scores(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    mask = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
    return torch.where(mask, x @ x.t(), 0.0).relu() + 1


def test_the_build_order_is_written_once_and_its_switches_are_checked_options() -> None:
    names = [name for name, _ in BUILD_STEPS]
    assert names == [
        "fold_constants",
        "bind_kernels",
        "lanes",
        "plan_memory",
        "place",
        "share_views",
    ]
    assert set(CHECKED_STEPS) == SWITCHABLE and SWITCHABLE <= set(names)
    assert Config.from_options({"disabled_build_steps": ["place"]}).disabled_build_steps == (
        "place",
    )
    with pytest.raises(ConfigError, match="disabled_build_steps must be a list or tuple of build"):
        Config.from_options({"disabled_build_steps": ["bind_kernels"]})


@pytest.mark.parametrize("disabled", [(), ("fold_constants",), ("place",), ("share_views",)])
def test_every_switch_replays_what_eager_computes(disabled: tuple[str, ...]) -> None:
    x = torch.randn(6, 6)
    graph = capture(masked_scores, x, pool=CpuPool(), disabled=disabled)
    for _ in range(2):
        x.copy_(torch.randn(6, 6))
        assert torch.equal(graph.replay()[0], masked_scores(x))
    folded = graph.step_kinds["constant"]
    assert (folded > 0) == ("fold_constants" not in disabled and "place" not in disabled)
    assert (graph.placed is None) == ("place" in disabled)


def test_a_key_holds_one_program_and_releasing_drops_it() -> None:
    x = torch.randn(6, 6)
    graph = capture(masked_scores, x, pool=CpuPool())
    program = weakref.ref(graph.program)
    graph.release()
    gc.collect()
    assert graph.program is RELEASED and program() is None
    assert (graph.kernel_count, graph.pool_bytes, graph.outputs) == (0, 0, [])
