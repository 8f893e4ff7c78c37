"""What do many keys of one graph hold in memory once their input buffers live in the pool?

One graph, ``(x * 2).sum(0)`` with ``dynamic=True``, called with ``--keys`` row counts of a
4096-column float32 input (each a key, up to 3.25 MiB of input for the largest), in a fresh process
per mode: ``force_eager`` (the baseline), and capture and replay. Reported: the growth of resident
memory over those calls (after the first, which compiles), the pool bytes ``stats()`` reports, and
the largest input. Linux only (reads /proc/self/status).

    python benchmarks/input_buffer_memory.py
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from typing import Any

import torch
from common import add_common_args, format_table, print_heading, write_json
from pool_memory import status_kib

import npugraph_ex

COLUMNS = 4096
FIRST_ROWS = 8


def double_then_sum(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum(0)


@torch.no_grad()
def child(mode: str, keys: int) -> dict[str, Any]:
    options = {"capture_limit": keys + 1, "force_eager": mode == "force_eager"}
    fn = torch.compile(double_then_sum, backend="npugraph_ex", dynamic=True, options=options)
    fn(torch.randn(FIRST_ROWS, COLUMNS))
    gc.collect()
    before = status_kib("VmRSS")
    for rows in range(FIRST_ROWS + 1, FIRST_ROWS + 1 + keys):
        fn(torch.randn(rows, COLUMNS))
    gc.collect()
    totals = npugraph_ex.stats()["totals"]
    return {
        "mode": mode,
        "keys": totals["captures"],
        "resident_growth_bytes": (status_kib("VmRSS") - before) * 1024,
        "pool_bytes": totals["pool_bytes"],
        "largest_input_bytes": (FIRST_ROWS + keys) * COLUMNS * 4,
    }


def run_child(mode: str, keys: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", mode, "--keys", str(keys)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {mode} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200, help="shapes called (default 200)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_common_args(parser, "input_buffer_memory", repeats=1)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.keys)))
        return
    rows = [run_child(mode, args.keys) for mode in ("force_eager", "replay")]
    mib = 2**20
    print_heading(
        f"(x * 2).sum(0), dynamic=True, {args.keys} row counts of a {COLUMNS}-column float32 "
        "input; one fresh process per mode"
    )
    header = ["mode", "keys captured", "resident growth MiB", "pool MiB", "largest input MiB"]
    table = [
        [
            r["mode"],
            r["keys"],
            f"{r['resident_growth_bytes'] / mib:.1f}",
            f"{r['pool_bytes'] / mib:.2f}",
            f"{r['largest_input_bytes'] / mib:.2f}",
        ]
        for r in rows
    ]
    print(format_table(header, table))
    write_json(args.out, "input_buffer_memory", vars(args), rows)


if __name__ == "__main__":
    main()
