"""A second process loads what the first compiled; anything a reuse would break is a miss.

Each run is a fresh process (``cache_run.py``). The module's cold run compiled and stored; each
test starts from a copy of its cache. A warm run must trace nothing and match eager, unless its
key, its inputs or the file changed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from warm_runs import RUN, run_fresh, write_model

from npugraph_ex.cache.files import FORMAT, read_entry

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")


def entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.rglob("compiled_module"))


def test_warm_process_traces_nothing_and_matches_eager(
    cold: tuple[Path, Path, dict[str, Any]], model_dir: Path, cache_dir: Path
) -> None:
    first = cold[2]
    warm = run_fresh(model_dir, cache_dir)
    assert first["info"]["compiled"] == 1 and first["info"]["saved"] == 1 and first["traced"] == 1
    assert warm["traced"] == 0
    assert warm["info"]["variants"] == 1
    assert (warm["info"]["hits"], warm["info"]["compiled"], warm["info"]["saved"]) == (3, 0, 0)
    assert warm["max_output_diff"] == 0.0 and warm["buffer_diff"] == 0.0
    assert warm["warnings"] == []
    assert first["info"]["build_seconds"] == 0.0 < warm["info"]["build_seconds"]
    [path] = entries(cache_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(("--options", '{"remove_noop_ops": false}'), id="options"),
        pytest.param(("--dtype", "float64"), id="dtype"),
        pytest.param(("--static",), id="dynamic"),
    ],
)
def test_a_changed_key_compiles_a_new_entry(
    model_dir: Path, cache_dir: Path, change: tuple[str, ...]
) -> None:
    changed = run_fresh(model_dir, cache_dir, *change)
    assert changed["traced"] == changed["info"]["compiled"] >= 1  # static: one per shape
    assert changed["max_output_diff"] == 0.0 and changed["warnings"] == []
    assert len(entries(cache_dir)) == 2


def test_an_edited_method_is_a_new_entry(tmp_path: Path, cache_dir: Path) -> None:
    edited = run_fresh(write_model(tmp_path / "edited", edit=" * 1.0"), cache_dir)
    assert edited["traced"] == 1 and edited["info"]["compiled"] == 1
    assert len(entries(cache_dir)) == 2


@pytest.mark.parametrize(
    ("shapes", "misfits", "reason"),
    [
        pytest.param("2x3x16,3x16", 0, "ranks, dtypes or values differ", id="rank"),
        pytest.param(
            "1x16,3x16",
            1,
            "shape guard 2 <= L['x'].size()[0] fails: L['x'].size()[0] is 1",
            id="size-1",
        ),
    ],
)
def test_inputs_that_do_not_fit_recompile_and_extend_the_entry(
    model_dir: Path, cache_dir: Path, shapes: str, misfits: int, reason: str
) -> None:
    report = run_fresh(model_dir, cache_dir, "--shapes", shapes)
    assert report["info"]["compiled"] == 1 and report["info"]["hits"] == 1
    assert report["info"]["misfits"] == misfits and report["max_output_diff"] == 0.0
    [warning] = report["warnings"]
    assert "does not fit the cached graphs" in warning and reason in warning
    [path] = entries(cache_dir)
    assert len(load_variants_at(path)) == 2


def load_variants_at(path: Path) -> list[Any]:
    import pickle

    return pickle.loads(read_entry(path)[1])


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        path.write_bytes(data[:-10] + bytes(b ^ 0xFF for b in data[-10:]))
    elif how == "older-format":
        path.write_bytes(data.replace(f'"format": {FORMAT}'.encode(), b'"format": 0', 1))
    elif how == "shared":
        path.chmod(0o644)


@pytest.mark.parametrize("how", ["truncated", "flipped", "older-format", "shared"])
def test_a_bad_file_is_reported_once_and_rebuilt(
    model_dir: Path, cache_dir: Path, how: str
) -> None:
    [path] = entries(cache_dir)
    corrupt(path, how)
    rebuilt = run_fresh(model_dir, cache_dir)
    assert rebuilt["info"]["compiled"] == 1 and rebuilt["max_output_diff"] == 0.0
    [warning] = rebuilt["warnings"]
    assert str(path) in warning and warning.endswith("it is rebuilt")
    assert len(load_variants_at(path)) == 1  # valid again
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_unwritable_cache_folder_runs_uncached_with_one_warning(
    model_dir: Path, tmp_path: Path
) -> None:
    if os.geteuid() == 0:  # root writes into read-only folders: use a file where a folder goes
        unwritable = tmp_path / "not-a-folder"
        unwritable.write_text("")
    else:
        unwritable = tmp_path / "read-only"
        unwritable.mkdir(mode=0o500)
    report = run_fresh(model_dir, unwritable)
    assert report["max_output_diff"] == 0.0 and report["info"]["saved"] == 0
    [warning] = report["warnings"]
    assert "cannot write the cache" in warning and "runs uncached" in warning


def test_a_full_cache_folder_runs_uncached_with_one_warning_and_leaves_no_part(
    model_dir: Path, tmp_path: Path
) -> None:
    full = run_fresh(model_dir, tmp_path / "cache", largest_file=1024)  # every entry is larger
    assert full["max_output_diff"] == 0.0 and full["buffer_diff"] == 0.0
    assert full["info"]["saved"] == 0
    [warning] = full["warnings"]
    assert "cannot write the cache" in warning and "File too large" in warning
    written = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert [(p.name, p.stat().st_size) for p in written] == [("compiled_module.lock", 0)]

    room = run_fresh(model_dir, tmp_path / "cache")  # room again: stored as if never full
    assert room["info"]["saved"] == 1 and room["warnings"] == []
    assert run_fresh(model_dir, tmp_path / "cache")["traced"] == 0


def test_a_cache_folder_deleted_under_a_running_process_is_written_again(
    model_dir: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    deleted = run_fresh(model_dir, cache_dir, "--shapes", "3x16,3x16,5x2x16", "--delete-after", "2")
    assert deleted["max_output_diff"] == 0.0 and deleted["buffer_diff"] == 0.0
    assert deleted["warnings"] == []
    assert deleted["info"]["saved"] == 2  # the second variant went to a new folder
    [path] = entries(cache_dir)
    assert len(load_variants_at(path)) == 1  # the first was deleted with the folder
    warm = run_fresh(model_dir, cache_dir, "--shapes", "5x2x16")
    assert warm["traced"] == 0 and warm["max_output_diff"] == 0.0


def test_two_processes_writing_one_entry_leave_one_valid_entry(
    model_dir: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "shared"
    command = [sys.executable, str(RUN), "--model-dir", str(model_dir), "--cache-dir",
               str(cache_dir)]  # fmt: skip
    both = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    reports = [json.loads(p.communicate(timeout=600)[0].splitlines()[-1]) for p in both]
    assert [r["max_output_diff"] for r in reports] == [0.0, 0.0]
    [path] = entries(cache_dir)
    assert not list(path.parent.glob("*.tmp"))
    assert len(load_variants_at(path)) == 1
