"""Fixtures of the compile cache tests: one cold run per module, copies of its cache."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from warm_runs import run_fresh, write_model


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """One cold run for the module: its model folder, its filled cache folder, its report."""
    folder = tmp_path_factory.mktemp("cold")
    model_dir = write_model(folder / "model")
    return model_dir, folder / "cache", run_fresh(model_dir, folder / "cache")


@pytest.fixture
def model_dir(cold: tuple[Path, Path, dict[str, Any]]) -> Path:
    return cold[0]


@pytest.fixture
def cache_dir(cold: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> Path:
    """A copy of the cold run's cache, for this test to change."""
    copy = tmp_path / "cache"
    shutil.copytree(cold[1], copy)
    return copy
