"""The JSON record of one benchmark run: what ran, when, where, with which settings.

Every record starts with the same five fields (``benchmark``, ``command``, ``timestamp``,
``environment``, ``settings``) so that records of different benchmarks read alike; the caller
adds its results under its own keys.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from npugraph_ex.bench.environment import environment


def run_record(
    name: str,
    settings: dict[str, Any],
    *,
    command: Sequence[str] | None = None,
    env: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The head of a record; ``command`` defaults to this process's script name and arguments."""
    return {
        "benchmark": name,
        "command": list(command)
        if command is not None
        else [Path(sys.argv[0]).name, *sys.argv[1:]],
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": env if env is not None else environment(),
        "settings": settings,
    }


def write_json(path: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as indented JSON (paths and other objects as strings); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    return path
