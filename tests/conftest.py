"""Shared fixtures: the device parametrisation, a clean Dynamo state per test, seeded models, a
scratch pattern registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

import npugraph_ex
from models import make_tiny_qwen3
from npugraph_ex.kernels.processes import PROCESSES
from npugraph_ex.passes.patterns import registry
from npugraph_ex.passes.patterns.builtin import (
    register_builtin_patterns,
    register_copied_operands_for,
    register_for,
)
from npugraph_ex.runtime.cpu import platform as cpu_platform

CUDA_PARAM = pytest.param(
    "cuda",
    marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
    ],
)


@pytest.fixture(params=["cpu", CUDA_PARAM])
def device(request: pytest.FixtureRequest) -> str:
    """Every device a runtime test must pass on: CPU always, CUDA when present."""
    return request.param


@pytest.fixture(autouse=True)
def reset_dynamo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled code, guards, counters and the row counts given to oneDNN from an earlier test
    must not leak into this one."""
    torch._dynamo.reset()
    npugraph_ex.reset_stats()
    monkeypatch.setattr(cpu_platform, "LINEAR_ROW_COUNTS", set())


@pytest.fixture(autouse=True)
def dynamo_static_default_kept() -> Iterator[None]:
    """A test leaves Dynamo's ``assume_static_by_default`` as it found it. On torch 2.11 threads
    racing calls of a ``dynamic=True`` function can leave it off for the process (it is patched
    process-wide around each call), and every later compile then traces every size symbolic:
    the test that did it fails here, not dozens of tests after it."""
    before = torch._dynamo.config.assume_static_by_default
    yield
    after = torch._dynamo.config.assume_static_by_default
    if after != before:
        torch._dynamo.config.assume_static_by_default = before
        pytest.fail(f"the test left Dynamo's assume_static_by_default {after} (was {before})")


@pytest.fixture(autouse=True)
def no_compile_left_running() -> Iterator[None]:
    """A kernel-tier compile an earlier test started (the CPU default compiles hot keys in a
    second process) must not take this test's cores or its place in the queue."""
    yield
    PROCESSES.shutdown()


@pytest.fixture
def seed() -> int:
    torch.manual_seed(0)
    return 0


@pytest.fixture
def tiny_qwen3_config() -> Callable[..., torch.nn.Module]:
    """The ``make_tiny_qwen3(**overrides)`` builder; skips the test when transformers is absent."""
    pytest.importorskip("transformers")
    return make_tiny_qwen3


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Patterns registered by a test are gone after it (``register_replacement``)."""
    register_builtin_patterns()
    for dtype in (torch.float16, torch.bfloat16):  # registered once: never dropped with a test's
        register_for(dtype)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        register_copied_operands_for(dtype)
    saved = {key: list(entries) for key, entries in registry().patterns.items()}
    seen = {key: list(reprs) for key, reprs in registry().seen_patterns.items()}
    yield
    registry().patterns.clear()
    registry().patterns.update(saved)
    registry().seen_patterns.clear()
    registry().seen_patterns.update(seen)
