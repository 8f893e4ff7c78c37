"""What do many captured keys cost in memory, against one, above the same loop run eagerly?

A tiny Qwen3 (vocabulary ``--vocab``) called without a cache on ``--keys`` lengths from
``--start`` on (one length per call, ``dynamic=True``, ``capture_limit=256``): every length is a
key. Each row is a fresh process, which builds the model, compiles it, runs the lengths, releases
freed heap (``malloc_trim``) and reports its peak resident set (``ru_maxrss``), its resident set
and the heap in use (``mallinfo2``). The same loop under ``force_eager`` (compiled, nothing
captured) is the baseline: *above eager* is what capturing adds; *per key*, what each key beyond
the first row's adds to it; *resident ratio*, a row's resident set above eager over the first
row's. The last columns take the model run eagerly, not compiled, as the baseline instead: what
the compiled function adds in all, the kernels its graph runs included (oneDNN keeps the code it
generates for each shape of a product). With ``--repeats N`` each row runs N triples of processes
and reports their medians.

    python benchmarks/key_memory.py
    python benchmarks/key_memory.py --keys 1 16 64 --vocab 8192 --start 128
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import resource
import subprocess
import sys
from typing import Any

from common import (
    add_common_args,
    format_table,
    median,
    print_heading,
    write_json,
)

from npugraph_ex.bench.memory import resident_bytes
from npugraph_ex.runtime.cpu.heap import release_free_heap

NAME = "key_memory"
MIB = 2**20
MEASURES = ("peak_mib", "resident_mib", "heap_in_use_mib")


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def child(args: argparse.Namespace, mode: str, keys: int) -> dict[str, Any]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import npugraph_ex
    from npugraph_ex.bench.presets import QWEN3_PRESETS

    fields = {**QWEN3_PRESETS["tiny"], "vocab_size": args.vocab}
    config = Qwen3Config(**fields, max_position_embeddings=args.start + keys + 8)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    options = {"capture_limit": 256, "force_eager": mode == "force_eager"}
    forward = (
        model
        if mode == "eager"
        else torch.compile(model, backend="npugraph_ex", dynamic=True, options=options)
    )
    ids = torch.randint(0, args.vocab, (1, args.start + keys))
    with torch.no_grad():
        for length in range(args.start, args.start + keys):
            forward(input_ids=ids[:, :length], use_cache=False)
    gc.collect()
    release_free_heap()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    return {
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "resident_mib": resident_bytes() / MIB,
        "heap_in_use_mib": libc.mallinfo2().uordblks / MIB,
        "pool_mib": npugraph_ex.stats()["totals"]["pool_bytes"] / MIB,
    }


def per_key(
    result: dict[str, Any], first: dict[str, Any], name: str, baseline: str = "above"
) -> str:
    """KiB that each key beyond the first row's adds to ``name`` (above ``baseline``)."""
    extra_keys = result["keys"] - first["keys"]
    if extra_keys <= 0:
        return "-"
    extra = result[baseline][name] - first[baseline][name]
    return f"{extra * 1024 / extra_keys:.0f}"


def run_child(args: argparse.Namespace, mode: str, keys: int) -> dict[str, Any]:
    flags = ["--vocab", str(args.vocab), "--start", str(args.start), "--child", mode, str(keys)]
    done = subprocess.run(
        [sys.executable, __file__, *flags], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measured_row(args: argparse.Namespace, keys: int) -> dict[str, Any]:
    """``args.repeats`` pairs of processes for ``keys`` keys, eager then captured, and the medians
    of what capturing adds."""
    runs = []
    for _ in range(args.repeats):
        eager = run_child(args, "force_eager", keys)
        captured = run_child(args, "capture", keys)
        uncompiled = run_child(args, "eager", keys)
        above = {name: captured[name] - eager[name] for name in MEASURES}
        above_uncompiled = {name: captured[name] - uncompiled[name] for name in MEASURES}
        runs.append({
            "force_eager": eager, "captured": captured, "eager": uncompiled,
            "above": above, "above_uncompiled": above_uncompiled,
        })  # fmt: skip
    return {
        "keys": keys,
        "runs": runs,
        "above": {name: median([run["above"][name] for run in runs]) for name in MEASURES},
        "above_uncompiled": {
            name: median([run["above_uncompiled"][name] for run in runs]) for name in MEASURES
        },
        "pool_mib": runs[-1]["captured"]["pool_mib"],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME, repeats=1)
    parser.add_argument("--keys", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--start", type=int, default=128, help="the first length")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args, args.child[0], int(args.child[1]))))
        return
    results = [measured_row(args, keys) for keys in args.keys]
    first = results[0]
    rows = []
    for result in results:
        above = result["above"]
        rows.append([
            result["keys"], f"{above['peak_mib']:.1f}", f"{above['resident_mib']:.1f}",
            f"{above['heap_in_use_mib']:.1f}", f"{result['pool_mib']:.2f}",
            *(per_key(result, first, name) for name in ("peak_mib", "resident_mib")),
            f"{above['resident_mib'] / first['above']['resident_mib']:.2f}x",
            f"{result['above_uncompiled']['resident_mib']:.1f}",
            per_key(result, first, "resident_mib", "above_uncompiled"),
        ])  # fmt: skip
    print_heading(
        f"tiny Qwen3, vocabulary {args.vocab}, lengths from {args.start}, dynamic=True; "
        "MiB above the same loop under force_eager; last two columns: above the model run "
        "uncompiled"
    )
    header = ["keys", "peak", "resident", "heap in use", "pool"]
    header += ["peak KiB per key", "resident KiB per key", "resident ratio"]
    header += ["resident above uncompiled", "its KiB per key"]
    print(format_table(header, rows))
    write_json(args.out, NAME, vars(args), results)


if __name__ == "__main__":
    main()
