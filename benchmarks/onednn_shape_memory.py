"""What does oneDNN keep for each new row count of a product through its linear kernel?

``pattern_fusion_pass`` runs products by weights of 64K elements and more through oneDNN's linear
kernel where the host probe says it pays (``passes/patterns/onednn_linear.py``). oneDNN generates
code for every shape it runs and keeps it in a process-wide cache (up to 1024 entries), so each
new row count of a dynamic graph (each length of a growing loop, each captured key) costs that
code once per distinct weight shape, for the life of the process. This script measures it: for
each distinct weight shape of a Qwen3 preset's ``nn.Linear`` layers, the resident set before and
after running ``--counts`` new row counts from ``--start`` through oneDNN's linear kernel, then
through ATen's ``mm`` (``x @ w.t()``, what the same product costs without the pattern), freed heap
released (``malloc_trim``) before each reading. The last row sums the shapes oneDNN is given
(weights of ``LINEAR_MIN_WEIGHT_ELEMENTS`` and more): what one new row count costs the model.

    python benchmarks/onednn_shape_memory.py
    python benchmarks/onednn_shape_memory.py --preset tiny --vocab 8192 --start 128 --counts 32
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

import torch
from common import (
    QWEN3_PRESETS,
    add_common_args,
    apply_threads,
    format_table,
    print_heading,
    settings_of,
    write_json,
)
from transformers import Qwen3Config, Qwen3ForCausalLM

from npugraph_ex.bench.memory import resident_bytes
from npugraph_ex.compat import onednn_linear_op
from npugraph_ex.runtime.cpu.heap import release_free_heap
from npugraph_ex.runtime.cpu.platform import LINEAR_MIN_WEIGHT_ELEMENTS

NAME = "onednn_shape_memory"


def resident_kib() -> float:
    """The resident set after a collection, with freed heap given back to the system."""
    gc.collect()
    release_free_heap()
    return resident_bytes() / 1024


def weight_shapes(preset: str, vocab: int) -> list[tuple[int, int]]:
    """The distinct ``[out, in]`` shapes of the preset's linear weights, in model order."""
    config = Qwen3Config(**{**QWEN3_PRESETS[preset], "vocab_size": vocab})
    model = Qwen3ForCausalLM(config)
    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return list(dict.fromkeys(shapes))


def kib_per_count(product: Any, weight: torch.Tensor, rows: range) -> float:
    """Resident KiB each new row count of ``product(x, weight)`` leaves behind."""
    product(torch.randn(rows.start - 1, weight.shape[1]), weight)  # first-call costs
    before = resident_kib()
    for count in rows:
        product(torch.randn(count, weight.shape[1]), weight)
    return (resident_kib() - before) / len(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME, repeats=1)
    parser.add_argument("--preset", default="tiny", choices=sorted(QWEN3_PRESETS))
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--start", type=int, default=128, help="the first new row count")
    parser.add_argument("--counts", type=int, default=32, help="new row counts per shape")
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    linear = onednn_linear_op()
    if linear is None:
        raise SystemExit("this torch build has no oneDNN linear kernel")
    rows = range(args.start, args.start + args.counts)
    results, table = [], []
    with torch.no_grad():
        for out_features, in_features in weight_shapes(args.preset, args.vocab):
            weight = torch.randn(out_features, in_features)
            onednn = kib_per_count(lambda x, w: linear(x, w, None, "none", [], ""), weight, rows)
            mm = kib_per_count(lambda x, w: x @ w.t(), weight, rows)
            taken = weight.numel() >= LINEAR_MIN_WEIGHT_ELEMENTS
            results.append({
                "shape": [out_features, in_features], "taken": taken,
                "onednn_kib_per_count": onednn, "mm_kib_per_count": mm,
            })  # fmt: skip
            table.append([
                f"{out_features} x {in_features}", "yes" if taken else "no",
                f"{onednn:.0f}", f"{mm:.0f}",
            ])  # fmt: skip
    taken_sum = sum(r["onednn_kib_per_count"] for r in results if r["taken"])
    table.append(["model, shapes taken", "", f"{taken_sum:.0f}", ""])
    print_heading(
        f"Qwen3 {args.preset}, vocabulary {args.vocab}, row counts {rows.start}-{rows.stop - 1}"
    )
    header = ["weight", "taken by the pattern", "oneDNN KiB per row count", "mm KiB per row count"]
    print(format_table(header, table))
    write_json(args.out, NAME, settings_of(args), results)


if __name__ == "__main__":
    main()
