"""``deadlock_check=True`` in one process: what it finds in stream blocks, and the one log line per
graph that says it found no risk (the ranks' comparison of collectives is in
``tests/distributed``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

from npugraph_ex.errors import DeadlockRiskError
from npugraph_ex.scope import (
    npu_create_tagged_event,
    npu_tagged_event_record,
    npu_tagged_event_wait,
    stream,
)

LOGGER = "npugraph_ex.capture.deadlock"
LINE = re.compile(r"npugraph_ex: deadlock_check: graph\[[\w/]+\]: (.*): No deadlock risks detected")

READY = npu_create_tagged_event("deadlock_check_ready")
DONE = npu_create_tagged_event("deadlock_check_done")


def plain(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


def two_blocks(x: torch.Tensor) -> torch.Tensor:
    npu_tagged_event_record(READY)
    with stream("a"):
        npu_tagged_event_wait(READY)
        y = x.sin()
    with stream("b"):
        z = x.cos()
    return y + z


def broken_in_two(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos()


def found(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What each deadlock_check line says it checked."""
    lines = []
    for record in caplog.records:
        if record.name == LOGGER and "deadlock_check" in record.getMessage():
            assert record.levelno == logging.INFO
            match = LINE.fullmatch(record.getMessage())
            assert match is not None, record.getMessage()
            lines.append(match.group(1))
    return lines


@pytest.mark.parametrize(
    ("fn", "checked"),
    [
        (plain, ["no collectives and no stream blocks"]),
        (two_blocks, ["2 stream blocks without circular waits"]),
        (broken_in_two, ["no collectives and no stream blocks"] * 2),
    ],
    ids=["plain", "stream blocks", "two graphs"],
)
@torch.no_grad()
def test_each_graph_checked_says_once_that_it_found_no_risk(
    fn: Callable[[torch.Tensor], torch.Tensor], checked: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    compiled = torch.compile(fn, backend="npugraph_ex", options={"deadlock_check": True})
    with caplog.at_level(logging.INFO, logger="npugraph_ex"):
        for _ in range(3):
            x = torch.randn(4)
            assert torch.equal(compiled(x), fn(x))
    assert found(caplog) == checked


@torch.no_grad()
def test_without_the_option_nothing_is_said(caplog: pytest.LogCaptureFixture) -> None:
    compiled = torch.compile(two_blocks, backend="npugraph_ex")
    with caplog.at_level(logging.INFO, logger="npugraph_ex"):
        compiled(torch.randn(4))
    assert found(caplog) == []


def crossed_waits(x: torch.Tensor) -> torch.Tensor:
    with stream("a"):
        npu_tagged_event_wait(DONE)
        y = x.sin()
        npu_tagged_event_record(READY)
    with stream("b"):
        npu_tagged_event_wait(READY)
        z = x.cos()
        npu_tagged_event_record(DONE)
    return y + z


@torch.no_grad()
def test_the_check_finds_circular_waits_where_the_plan_did_not_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = {"deadlock_check": True, "disabled_passes": ["plan_streams"]}
    compiled = torch.compile(crossed_waits, backend="npugraph_ex", options=options)
    with caplog.at_level(logging.INFO, logger="npugraph_ex"):
        with pytest.raises(
            BackendCompilerFailed, match="stream blocks wait on each other"
        ) as raised:
            compiled(torch.randn(4))
    assert isinstance(raised.value.inner_exception, DeadlockRiskError)  # out of Dynamo's wrapper
    assert found(caplog) == []
