"""The compile cache keeps background kernels: a warm process starts on the kernels an earlier
one compiled and kept, without compiling or trying them again (``cache/kernel_files``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

RUN = Path(__file__).with_name("background_cache_run.py")


def run_fresh(cache_dir: Path, *flags: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(RUN), "--cache-dir", str(cache_dir), *flags],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def kernel_files(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.rglob("*.kernels"))


@pytest.fixture(scope="module")
def cold_runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``cold(tmp_path, *flags)``: a copy, in ``tmp_path``, of the cache a cold run with
    ``flags`` filled, and that run's report; each set of flags runs cold once per module."""
    made: dict[tuple[str, ...], tuple[Path, dict[str, Any]]] = {}

    def cold(tmp_path: Path, *flags: str) -> tuple[Path, dict[str, Any]]:
        if flags not in made:
            folder = tmp_path_factory.mktemp("cold")
            made[flags] = (folder, run_fresh(folder, *flags))
        folder, report = made[flags]
        copy = tmp_path / "cache"
        shutil.copytree(folder, copy)
        return copy, report

    return cold


@pytest.mark.parametrize(
    ("flags", "keys"),
    [
        pytest.param(("--rows", "4"), 1, id="static"),
        pytest.param(("--rows", "3,5", "--dynamic"), 2, id="symbolic"),
    ],
)
def test_a_warm_process_starts_on_the_kernels_a_cold_one_kept(
    tmp_path: Path, cold_runs: Any, flags: tuple[str, ...], keys: int
) -> None:
    cache, cold = cold_runs(tmp_path, *flags)
    assert cold["states"] == {"kernels": keys}, cold
    assert cold["compiles"] >= 1 and cold["max_output_diff"] < 1e-5
    stored = kernel_files(cache)
    assert len(stored) == 1  # one compile: the key's, or the one every key shares
    assert ("shared" in stored[0].name) == ("--dynamic" in flags)

    warm = run_fresh(cache, *flags)
    assert warm["states"] == {"kernels": keys}, warm
    assert warm["compiles"] == 0  # nothing compiled again
    assert cold["trial_calls"] >= 10 * keys and warm["trial_calls"] == 0  # kept: no trial
    assert warm["max_output_diff"] < 1e-5
    assert warm["info"]["hits"] == warm["calls"] and warm["warnings"] == []


def test_a_corrupt_kernel_file_is_compiled_again_with_one_warning(
    tmp_path: Path, cold_runs: Any
) -> None:
    cache, _ = cold_runs(tmp_path, "--rows", "4")
    (stored,) = kernel_files(cache)
    data = bytearray(stored.read_bytes())
    data[-10] ^= 0xFF
    stored.write_bytes(bytes(data))

    warm = run_fresh(cache, "--rows", "4")
    assert warm["states"] == {"kernels": 1} and warm["compiles"] == 1
    assert warm["max_output_diff"] < 1e-5
    (said,) = warm["warnings"]
    assert "corrupt" in said and "compiled again" in said


def test_stored_kernels_that_do_not_load_are_compiled_again(tmp_path: Path, cold_runs: Any) -> None:
    from npugraph_ex.cache.files import read_entry
    from npugraph_ex.cache.kernel_files import KernelFiles
    from npugraph_ex.kernels.tier import StoredKernels

    flags = ("--rows", "3,5", "--dynamic")
    cache, _ = cold_runs(tmp_path, *flags)
    (stored,) = kernel_files(cache)
    header, _ = read_entry(stored)
    broken = StoredKernels(None, b"not a compiled graph", header["guards"])
    KernelFiles(stored.parent).save(header["graph"], broken)  # a checked file, unloadable kernels

    warm = run_fresh(cache, *flags)
    assert warm["states"] == {"kernels": 2}, warm  # both keys, not only the first to see it
    assert warm["compiles"] == 1 and warm["warnings"] == []
    assert warm["max_output_diff"] < 1e-5


def test_stored_kernels_serve_other_weights(tmp_path: Path, cold_runs: Any) -> None:
    # The weights are the kernels' arguments, never baked in: a process whose model was loaded
    # with other weights starts on the same stored kernels and gives its own weights' results.
    cache, _ = cold_runs(tmp_path, "--rows", "4")
    warm = run_fresh(cache, "--rows", "4", "--seed", "1")
    assert warm["states"] == {"kernels": 1} and warm["compiles"] == 0, warm
    assert warm["max_output_diff"] < 1e-5 and warm["warnings"] == []


def test_a_kernel_file_swapped_for_another_keys_is_refused_by_its_key(tmp_path: Path) -> None:
    # Each file names the sizes it was compiled for inside its checked payload: a file put in
    # another key's place (copied over it) serves only the key it was built for, and the key
    # whose file it replaced compiles again instead of calling kernels built for other sizes.
    run_fresh(tmp_path, "--rows", "4,6")
    first, second = kernel_files(tmp_path)
    first.write_bytes(second.read_bytes())

    warm = run_fresh(tmp_path, "--rows", "4,6")
    assert warm["states"] == {"kernels": 2}, warm
    assert warm["compiles"] == 1 and warm["max_output_diff"] < 1e-5
