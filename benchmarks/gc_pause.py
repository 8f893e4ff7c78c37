"""How long does one of Python's full garbage collections stop a serving loop, and what does
``gc.freeze()`` after the warm-up leave of it?

A process that imported torch and transformers and compiled a model tracks about half a million
container objects; Python's collector walks all of them in a full (generation 2) collection, in
whichever call of the serving thread its allocations trigger it. In a fresh process: the tiny
Qwen3's one-token forward on the CPU default, settled on its kernels; a full collection timed
three times; then a serving loop whose own code keeps a small record of every call (a server's
request history), so that its heap grows and full collections come as they would (one each time
the objects that survived collections grew by a quarter of those alive before); then the same
after ``gc.freeze()``, which moves every object alive into a permanent generation that
collections skip.

    python benchmarks/gc_pause.py --calls 60000
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def full_collections(times: int) -> list[float]:
    """Milliseconds of ``times`` full collections."""
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        gc.collect()
        seconds.append((time.perf_counter() - started) * 1e3)
    return seconds


def serving_loop(fn: Any, args: tuple[Any, ...], calls: int) -> dict[str, Any]:
    """``calls`` calls, each keeping a small record; the median and slowest call, and the full
    collections that ran inside calls with their calls' times."""
    full = [0]
    gc.callbacks.append(lambda phase, info: full.__setitem__(0, full[0] + (
        phase == "start" and info["generation"] == 2)))  # fmt: skip
    log: list[dict[str, Any]] = []
    seconds, in_full = [], []
    try:
        for number in range(calls):
            before = full[0]
            started = time.perf_counter()
            fn(*args)
            log.append({"call": number, "tokens": [number], "parts": [[number], [started]]})
            elapsed = time.perf_counter() - started
            seconds.append(elapsed)
            if full[0] != before:
                in_full.append(round(elapsed * 1e3, 1))
    finally:
        gc.callbacks.pop()
    return {
        "median_ms": round(statistics.median(seconds) * 1e3, 3),
        "slowest_ms": round(max(seconds) * 1e3, 1),
        "full_collections_in_calls": in_full,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=60_000)
    args = parser.parse_args()
    sys.path[:0] = [str(HERE)]
    import torch
    from common import environment, environment_line
    from side_by_side import build, settle

    fn, inputs = build("qwen3-token")
    compiled = torch.compile(fn, backend="npugraph_ex")
    with torch.no_grad():
        print(f"default settled on: {settle(compiled, inputs, limit_s=600)}")
        for label in ("as imported", "after gc.freeze()"):
            if label != "as imported":
                gc.collect()
                gc.freeze()
            tracked = len(gc.get_objects())
            collect_ms = statistics.median(full_collections(3))
            loop = serving_loop(compiled, inputs, args.calls)
            print(
                f"{label}: {tracked:,} tracked objects ({gc.get_freeze_count():,} frozen); a full "
                f"collection {collect_ms:.1f} ms; {args.calls:,} calls: median "
                f"{loop['median_ms']} ms, slowest {loop['slowest_ms']} ms; full collections "
                f"inside calls: {len(loop['full_collections_in_calls'])}, those calls (ms): "
                f"{loop['full_collections_in_calls']}"
            )
    print(environment_line(environment()))


if __name__ == "__main__":
    main()
