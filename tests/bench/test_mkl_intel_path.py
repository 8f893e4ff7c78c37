"""``benchmarks/mkl_intel_path.py`` runs a command with MKL taking its Intel code paths, and the
benchmark record says which paths ran."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npugraph_ex.bench.environment import environment, environment_line, mkl_intel_paths

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mkl_intel_path.py"
ASK = "from npugraph_ex.bench.environment import mkl_intel_paths; print(mkl_intel_paths())"

needs_mkl_and_cc = pytest.mark.skipif(
    not torch.backends.mkl.is_available() or shutil.which("cc") is None,
    reason="needs torch with MKL and a C compiler",
)


def run_script(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@needs_mkl_and_cc
def test_the_command_runs_with_mkls_intel_paths() -> None:
    done = run_script("--", sys.executable, "-c", ASK)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


@needs_mkl_and_cc
def test_the_commands_exit_status_comes_back() -> None:
    assert run_script("--", sys.executable, "-c", "raise SystemExit(3)").returncode == 3


def test_a_missing_command_is_a_usage_error() -> None:
    done = run_script()
    assert done.returncode == 2
    assert "give the command to run after --" in done.stderr


def test_the_record_and_the_report_line_name_the_paths() -> None:
    env = environment()
    assert env["mkl_intel_paths"] == mkl_intel_paths()
    line = environment_line({**env, "mkl_intel_paths": True})
    assert "MKL's Intel code paths: yes" in line
    assert "MKL's" not in environment_line({**env, "mkl_intel_paths": None})
