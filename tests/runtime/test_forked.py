"""A forked child of a process that ran parallel kernels: one intra-op thread, said once.

The real fork (a child serving a replay and compiled kernels, the parent's compile processes
left alone) is ``tests/kernels/fork_run.py``; here the decision, called as the fork would."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from npugraph_ex.runtime.cpu import forked
from npugraph_ex.runtime.cpu.forked import ForkedChildren


@pytest.fixture
def two_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_a_child_of_a_process_that_captured_nothing_parallel_keeps_its_threads(
    two_threads: None,
) -> None:
    children = ForkedChildren()
    children.after_fork_in_child()
    assert torch.get_num_threads() == 2


def test_a_child_of_a_process_that_ran_parallel_kernels_gets_one_thread(
    two_threads: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(forked, "gnu_openmp_loaded", lambda: True)
    children = ForkedChildren()
    children.ran_parallel()
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        children.after_fork_in_child()
    assert torch.get_num_threads() == 1
    assert "forked after running parallel kernels" in caplog.text
    assert "'spawn' or 'forkserver'" in caplog.text


def test_an_openmp_that_restarts_its_threads_after_a_fork_keeps_them(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forked, "gnu_openmp_loaded", lambda: False)
    children = ForkedChildren()
    children.ran_parallel()
    children.after_fork_in_child()
    assert torch.get_num_threads() == 2
