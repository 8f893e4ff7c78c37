"""Graph dumps under ``TORCH_COMPILE_DEBUG=1`` (torch's debug folder) and ``debug_dump_dir``."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from npugraph_ex import config
from npugraph_ex.config import Config
from npugraph_ex.debug import once
from npugraph_ex.debug.compile_debug import torch_debug_run
from npugraph_ex.passes.manager import PassManager
from npugraph_ex.passes.pipeline import PIPELINE


def matmul_add_relu(x: torch.Tensor) -> torch.Tensor:
    return (x @ x + 1).relu()


def compile_and_call(options: dict | None = None) -> None:
    fn = torch.compile(matmul_add_relu, backend="npugraph_ex", options=options or {})
    with torch.no_grad():
        for _ in range(2):
            fn(torch.randn(3, 3))


def expected_files() -> list[str]:
    passes = [p.name for p in PassManager(PIPELINE, Config()).selected()]
    dumps = [f"{i:02d}_after_{name}.py" for i, name in enumerate(passes, start=1)]
    # "kernels": the graph lowered again for the kernel tier (the CPU default), its own dumps.
    return sorted(["00_input.py", *dumps, "captured.py", "debug.log", "key0.json", "kernels"])


@pytest.fixture
def torch_debug_root(tmp_path: Path) -> Iterator[Path]:
    """Dynamo's debug folder, under ``tmp_path`` (set through its config's own ``patch``:
    pytest's ``monkeypatch`` undoes a setting of a config module by deleting it, since 9.2)."""
    root = tmp_path / "torch"
    with torch._dynamo.config.patch(debug_dir_root=str(root)):
        yield root


def test_torch_compile_debug_writes_into_torchs_run_folder(
    torch_debug_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_COMPILE_DEBUG", "1")
    torch_debug_run.cache_clear()
    try:
        compile_and_call()
    finally:
        torch_debug_run.cache_clear()
    [folder] = torch_debug_root.glob(f"run_*-pid_{os.getpid()}/npugraph_ex/graph[[]0_0[]]")
    assert (folder.parent.parent / "torchdynamo").is_dir()  # Dynamo's files sit next to ours
    assert sorted(p.name for p in folder.iterdir()) == expected_files()
    summary = json.loads((folder / "key0.json").read_text())
    assert summary["key"].startswith("key0: shapes=[3x3]")
    assert summary["steps"] == ["aten.mm.out", "aten.add_.Tensor", "aten.relu_.default"]
    assert summary["kernels"] == 3 and summary["pool_bytes"] > 0
    captured = (folder / "captured.py").read_text()
    assert "# device_type: 'cpu'" in captured and "torch.ops.aten.relu_.default" in captured
    log = (folder / "debug.log").read_text()
    assert "DEBUG npugraph_ex.compiler: graph[0/0]: compiling" in log
    assert "DEBUG npugraph_ex.passes.manager: graph[0/0]: pass remove_noop_ops took" in log
    assert "DEBUG npugraph_ex.capture.manager: graph[0/0]: captured key0: shapes=[3x3]" in log


def test_the_debug_log_leaves_the_applications_logging_as_it_was(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The one-time warning below, even if said before (the option messages keep their own set).
    monkeypatch.setattr(once, "SEEN", set())
    monkeypatch.setattr(config, "_logged_once", set())
    logger = logging.getLogger("npugraph_ex")
    before = (logger.level, logger.propagate, list(logger.handlers))
    with caplog.at_level(logging.INFO):
        compile_and_call({"debug_dump_dir": str(tmp_path), "super_kernel_optimize": True})
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    seen = [(r.levelname, r.name) for r in caplog.records if r.name.startswith("npugraph_ex")]
    assert ("WARNING", "npugraph_ex.config") in seen  # what the application sees reaches it
    assert all(level != "DEBUG" for level, _ in seen)  # and the file's DEBUG lines do not
    [folder] = tmp_path.iterdir()
    assert "super_kernel_optimize" in (folder / "debug.log").read_text()


def test_debug_dump_dir_wins_and_nothing_is_written_without_either(
    tmp_path: Path, torch_debug_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCH_COMPILE_DEBUG", raising=False)
    compile_and_call()
    assert not torch_debug_root.exists()
    compile_and_call({"debug_dump_dir": str(tmp_path / "mine")})
    [folder] = (tmp_path / "mine").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == expected_files()
    assert any(
        p.name.endswith("_after_dead_code_elimination.py") for p in (folder / "kernels").iterdir()
    )
