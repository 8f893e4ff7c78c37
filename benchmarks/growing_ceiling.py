"""How fast can the growing loop get on this host: per sequence length, and over the whole loop?

The demo's growing loop (greedy generation without a KV cache) calls the tiny Qwen3 on every
length from its prompt to prompt + tokens - 1; each call runs the whole sequence. Per sampled
length (``--lengths``; the default spans the demo's 4-35), compiled with ``dynamic=False`` and
timed in one interleaved loop (median per call):

- *eager*: the model's forward;
- *npugraph_ex*: default options;
- *kernels*: the key's captured kernels alone, in a plain loop over its recorded steps: what any
  replay of these kernels (one per op, the products already through oneDNN where it pays) costs
  with every host cost gone. eager / kernels is the most a replay can gain;
- *products*: the key's matrix products alone, in the same loop with every other step left out
  (oneDNN's linear, ``mm``, and the few-row split's ``bmm``): no code calling these product
  kernels goes below it, however well it fuses the rest;
- *static kernels*: ``static_kernel_compile``: Inductor's fused code per key;
- *Inductor, frozen weights*: ``torch.compile`` with Inductor, ``cpp_wrapper`` and
  ``freezing``, which packs every linear weight into oneDNN's blocked layout (a second copy of
  the weights) and fuses the rest: the fastest code PyTorch generates for this model here;
- *floor*: the arithmetic of the matrix products (2 x rows x weight elements) at the rate this
  host's ``sgemm`` reaches on large matrices, or the weights' bytes at the streaming bandwidth,
  whichever is larger (``breakdown.py``).

The *loop* row adds the sampled lengths: with lengths spaced evenly over the loop, its ratios are
those of the whole loop.

    python benchmarks/growing_ceiling.py --plot docs/figures/growing_ceiling.png
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from breakdown import bandwidth_bytes_per_second, gemm_flops_per_second, linear_weights
from common import (
    QWEN3_PRESETS,
    add_common_args,
    apply_threads,
    format_table,
    interleaved,
    live_graph_numbers,
    manager_arguments,
    median,
    print_heading,
    settings_of,
    step_loop,
    with_inputs,
    write_json,
)

from npugraph_ex.bench.graphs import managers_since
from npugraph_ex.bench.presets import build_qwen3
from npugraph_ex.bench.variants import own_code

NAME = "growing_ceiling"
LENGTHS = (4, 8, 12, 16, 20, 24, 28, 32, 35)
PRODUCT_OPS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "_linear_pointwise")
LABELS = {
    "kernels": "kernels alone (no host cost)",
    "products": "products alone (no other kernel)",
    "floor": "floor (weight reads or arithmetic)",
}
VARIANTS = (
    "eager", "npugraph_ex", "kernels", "products", "static kernels", "Inductor, frozen weights"
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME, repeats=7)
    parser.add_argument("--preset", choices=sorted(QWEN3_PRESETS), default="tiny")
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=list(LENGTHS),
        help=f"sequence lengths to time (default {' '.join(map(str, LENGTHS))})",
    )
    parser.add_argument("--calls", type=int, default=20, help="calls per timed block")
    parser.add_argument(
        "--no-inductor", action="store_true", help="leave out Inductor with frozen weights"
    )
    parser.add_argument("--plot", default=None, help="write a PNG chart here")
    return parser.parse_args(argv)


def compiled_calls(
    model: torch.nn.Module, tokens: torch.Tensor, inductor: bool
) -> dict[str, Callable[[], Any]]:
    """Every variant as a call on ``tokens``, each compiled (and its key captured) first."""

    def forward(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    def compiled(tag: str, **kwargs: Any) -> Callable[[], Any]:
        fn = torch.compile(own_code(forward, tag), dynamic=False, **kwargs)
        fn(tokens)
        fn(tokens)
        return lambda: fn(tokens)

    calls = {"eager": lambda: forward(tokens)}
    before = live_graph_numbers()
    calls["npugraph_ex"] = compiled(f"default_{tokens.shape[1]}", backend="npugraph_ex")
    manager, args_in = manager_arguments(managers_since(before), calls["npugraph_ex"])
    graph = next(iter(manager.entries.values())).graph
    calls["kernels"] = with_inputs(manager, args_in, step_loop(graph))
    calls["products"] = with_inputs(manager, args_in, step_loop(graph, is_product))
    calls["static kernels"] = compiled(
        f"static_{tokens.shape[1]}",
        backend="npugraph_ex",
        options={"static_kernel_compile": True},
    )
    if inductor:
        with torch._inductor.config.patch(freezing=True):
            calls["Inductor, frozen weights"] = compiled(
                f"frozen_{tokens.shape[1]}", options={"cpp_wrapper": True}
            )
    return calls


def is_product(name: str) -> bool:
    """Whether a step of that name is a matrix product (``mm``, ``bmm``, oneDNN's linear)."""
    return any(op in name for op in PRODUCT_OPS)


def timed(calls: dict[str, Callable[[], Any]], args: argparse.Namespace) -> dict[str, list[float]]:
    def block(call: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            return (time.perf_counter() - start) / args.calls

        return run

    with torch._inductor.config.patch(freezing=True):
        return interleaved({name: block(call) for name, call in calls.items()}, args.repeats)


def floor_ms(model: torch.nn.Module, rows: int, bandwidth: float, flops: float) -> float:
    weights = linear_weights(model)
    reads = sum(w.numel() * w.element_size() for w in weights) / bandwidth
    arithmetic = 2 * rows * sum(w.numel() for w in weights) / flops
    return max(reads, arithmetic) * 1e3


def table_rows(results: dict[str, dict[str, float]]) -> list[list[str]]:
    rows = []
    for name, ms in results.items():
        eager = ms["eager"]
        cells = [f"{ms[v]:.3f}" if v in ms else "-" for v in (*VARIANTS, "floor")]
        ratios = [f"{eager / ms[v]:.2f}x" if v in ms else "-" for v in (*VARIANTS[1:], "floor")]
        rows.append([name, *cells, *ratios])
    return rows


def with_loop(per_length: dict[int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The rows by length, then the loop: every column summed over the lengths."""
    rows = {f"length {length}": ms for length, ms in per_length.items()}
    columns = set.intersection(*(set(ms) for ms in per_length.values()))
    rows["loop"] = {c: sum(ms[c] for ms in per_length.values()) for c in columns}
    return rows


def plot(results: dict[str, dict[str, float]], path: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [name for name in results if name != "loop"]
    xs = [int(name.split()[1]) for name in lengths]
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for variant in (*VARIANTS[1:], "floor"):
        if all(variant in results[n] for n in lengths):
            speed = [results[n]["eager"] / results[n][variant] for n in lengths]
            style = "--" if variant in ("kernels", "floor") else "-"
            label = LABELS.get(variant, variant)
            ax.plot(xs, speed, style, marker="o", label=label)
    for goal in (2, 3):
        ax.axhline(goal, color="grey", linewidth=0.8, linestyle=":")
    ax.set_yscale("log")
    ax.set_yticks([1, 1.5, 2, 3, 5, 10, 15])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("speed-up over eager")
    ax.set_title("growing loop, tiny Qwen3: speed-up by length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    apply_threads(args.threads)
    model = build_qwen3(args.preset, seed=0)
    bandwidth, flops = bandwidth_bytes_per_second(), gemm_flops_per_second()
    per_length: dict[int, dict[str, float]] = {}
    raw: dict[int, dict[str, list[float]]] = {}
    with torch.no_grad():
        for length in args.lengths:
            tokens = torch.arange(length)[None] % model.config.vocab_size
            raw[length] = timed(compiled_calls(model, tokens, not args.no_inductor), args)
            per_length[length] = {name: median(t) * 1e3 for name, t in raw[length].items()}
            per_length[length]["floor"] = floor_ms(model, length, bandwidth, flops)
            torch._dynamo.reset()
    results = with_loop(per_length)
    print_heading(
        f"Qwen3 {args.preset}: streaming read {bandwidth / 1e9:.1f} GB/s; "
        f"sgemm {flops / 1e9:.0f} GFLOP/s; ms per call, median of {args.repeats} repeats"
    )
    header = [
        "length", *(f"{v} ms" for v in (*VARIANTS, "floor")),
        *(f"{v}: speed-up" for v in (*VARIANTS[1:], "floor")),
    ]  # fmt: skip
    print(format_table(header, table_rows(results)))
    if args.plot:
        plot(results, args.plot)
    rates = {"bandwidth_bytes_per_s": bandwidth, "sgemm_flops_per_s": flops}
    write_json(args.out, NAME, settings_of(args), {**rates, "ms": results, "raw_s": raw})


if __name__ == "__main__":
    main()
