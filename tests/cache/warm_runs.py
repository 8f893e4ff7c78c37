"""The compile cache tests' user model file and fresh-process runner (``cache_run.py``)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RUN = Path(__file__).with_name("cache_run.py")

USER_MODEL = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("total", torch.zeros(16))

    def forward(self, x):
        y = torch.relu(self.lin(x)){edit}
        self.total.add_(y.reshape(-1, 16).sum(0))
        return y * 2


def make():
    return Model()
"""

Runner = Callable[..., dict[str, Any]]


def write_model(folder: Path, edit: str = "") -> Path:
    """``user_model.py`` in ``folder``; ``edit`` is appended to the method's first line."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "user_model.py").write_text(USER_MODEL.replace("{edit}", edit))
    return folder


def run_fresh(
    model_dir: Path, cache_dir: Path, *flags: str, largest_file: int | None = None
) -> dict[str, Any]:
    """``cache_run.py`` in a new Python process; its JSON report. ``largest_file``: the most
    bytes a file the process writes may hold (``RLIMIT_FSIZE``: a full disk, to the writer)."""

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (largest_file, largest_file))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, str(RUN), "--model-dir", str(model_dir), "--cache-dir", str(cache_dir),
         *flags],
        capture_output=True, text=True, env=env, timeout=600, check=False,
        preexec_fn=None if largest_file is None else limit_files,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
