"""What ``npugraph-ex bench`` prints and draws: the only module of the package that prints.

Results go to stdout (the environment line, one Markdown table per workload, the files
written); progress and warnings go to stderr, so ``npugraph-ex bench > results.md`` keeps only
the results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from npugraph_ex.bench.environment import environment_line
from npugraph_ex.bench.plotting import PALETTE, Panel, bar_panels
from npugraph_ex.bench.precision import PRECISIONS
from npugraph_ex.bench.runner import WorkloadResult
from npugraph_ex.bench.tables import format_table
from npugraph_ex.bench.timing import spread
from npugraph_ex.bench.variants import BASELINE, VARIANTS

MIB = 2**20

COLOURS = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(VARIANTS)}
"""One colour per variant in every panel and every run."""


def model_name(info: dict[str, Any]) -> str:
    """``Qwen3 tiny`` for a preset, the architecture and folder for a checkpoint."""
    if info["checkpoint"] is None:
        return f"Qwen3 {info['name']}"
    return f"{info['architecture']} from {info['name']}"


def model_line(info: dict[str, Any], device: str) -> str:
    config = info["config"]
    weights = (
        f"random weights from seed {info['seed']}"
        if info["checkpoint"] is None
        else "the checkpoint's weights"
    )
    return (
        f"model: {model_name(info)} ({config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}, {info['parameters'] / 1e6:.2f}M parameters, {weights}, "
        f"dtype {info['dtype']}, {info['attn_implementation']} attention) on {device}"
    )


def headers(result: WorkloadResult, device: str) -> list[str]:
    memory = "peak MiB" if device == "cuda" else "RSS growth MiB"
    first = f"{result.workload.first_label} s"
    return ["variant", first, "tokens/s", "speed-up", "spread", "captured keys", memory,
            "pool MiB", "tokens = eager", "max abs logit diff"]  # fmt: skip


def row(result: WorkloadResult, name: str) -> list[Any]:
    """One variant's cells; ``-`` where a figure does not apply."""
    if name in result.failed:
        return [name, "failed", *["-"] * 8]
    record = result.variant_record(name)
    keys, pool = record["captured_keys"], record["pool_bytes"]
    if name == BASELINE:
        tokens, diff = "-", "-"
    else:
        agree = record["tokens_match_eager"]
        tokens = "yes" if agree else f"{record['tokens_agree']}/{record['tokens_checked']}"
        diff = f"{record['max_abs_logit_diff']:.3g}"
    return [
        name,
        record["first_call_s"],
        record["tokens_per_s"],
        f"{record['speedup_vs_eager']:.2f}x",
        f"{spread(result.variants[name].per_repeat_s):.0%}",
        keys if keys is not None else "-",
        record["peak_memory_bytes"] / MIB,
        pool / MIB if pool is not None else "-",
        tokens,
        diff,
    ]


def table(result: WorkloadResult, device: str) -> str:
    names = list(result.compile_args)
    text = format_table(headers(result, device), [row(result, n) for n in names])
    errors = [f"{name} failed: {error}" for name, error in result.failed.items()]
    settled = [
        v.settling.describe(name) for name, v in result.variants.items() if v.settling is not None
    ]
    return "\n".join([text, *errors, *settled])


NOTES = (
    "first run / first call: compilation and capture included (what a user waits for).",
    "tokens/s, speed-up (eager / variant): median of the interleaved repeats.",
    "spread: (max - min) / median of the repeats.",
    "{memory}.",
    "pool: bytes the npugraph_ex graph pools hold.",
    "tokens = eager: greedy tokens equal to eager's (else how many agree).",
    "max abs logit diff: over the steps fed the same tokens as eager.",
)

MEMORY_NOTE = {
    "cpu": "RSS growth: growth of the resident set over the variant's first run",
    "cuda": "peak: torch.cuda.max_memory_allocated over the first run, weights included",
}


def report(
    env: dict[str, Any],
    info: dict[str, Any],
    results: list[WorkloadResult],
    args: argparse.Namespace,
) -> None:
    """Print the environment, the model and one table per workload to stdout."""
    print()
    print(environment_line(env))
    print(model_line(info, args.device))
    for result in results:
        print()
        print(
            f"{result.workload.title}; {args.dtype}, median of {args.repeats} interleaved repeats"
        )
        print()
        print(table(result, args.device))
    print()
    for note in NOTES:
        print(note.format(memory=MEMORY_NOTE[args.device]))
    print(PRECISIONS[args.dtype].note())
    print()


def wrote(path: Path) -> None:
    print(f"wrote {path}")


def plot(
    results: list[WorkloadResult],
    path: Path,
    env: dict[str, Any],
    info: dict[str, Any],
    repeats: int,
) -> None:
    """One panel per workload: ms per token of every variant. Skipped without matplotlib."""
    panels = []
    for result in results:
        tokens = result.workload.block_tokens
        times = {n: [t / tokens * 1e3 for t in r.per_repeat_s] for n, r in result.variants.items()}
        panels.append(Panel(result.workload.chart_title, times, COLOURS))
    where = env.get("accelerator") or env["device"]
    title = (
        f"{model_name(info)} ({info['parameters'] / 1e6:.2f}M parameters, {info['dtype']}): "
        f"eager vs npugraph_ex\n{where}, {env['cores']} cores, {env['torch_threads']} torch "
        f"threads, torch {env['torch']}, transformers {env['transformers']}\nmedian of {repeats} "
        "interleaved repeats, whiskers: interquartile range; labels: ms per token, speed-up "
        "over eager"
    )
    try:
        written = bar_panels(
            panels, path, title=title, unit="ms", ylabel="ms per token (lower is better)"
        )
    except ImportError as error:
        print(
            f"npugraph-ex bench: no plot ({error}); install matplotlib "
            "(pip install 'npugraph_ex[bench]') or pass --no-plot",
            file=sys.stderr,
        )
        return
    wrote(written)
