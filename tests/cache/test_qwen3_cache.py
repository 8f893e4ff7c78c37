"""A tiny Qwen3's cached prefill and decode: the second process traces nothing, binds its own
model and KV cache, and generates the tokens eager does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

RUN = Path(__file__).with_name("qwen3_run.py")
TESTS = Path(__file__).parents[1]


def generate_fresh(cache_dir: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(RUN), str(cache_dir), str(TESTS)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_prefill_and_decode_load_in_a_second_process(tmp_path: Path) -> None:
    cold = generate_fresh(tmp_path)
    warm = generate_fresh(tmp_path)
    for report in (cold, warm):
        assert report["equal"] == [True, True] and report["cache_written"] == [True, True]
    assert cold["traced"] >= 2 and cold["prefill"]["saved"] >= 1 and cold["decode"]["saved"] >= 1
    assert warm["traced"] == 0
    assert warm["prefill"]["compiled"] == warm["decode"]["compiled"] == 0
    assert warm["prefill"]["hits"] == 2 and warm["decode"]["hits"] == 6
    assert cold["prefill"]["path"] != cold["decode"]["path"]
