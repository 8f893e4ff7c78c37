"""What each key's choice of kernels buys a graph compiled with ``dynamic=True``.

The tiny Qwen3 without a KV cache, called on every length of ``--lengths`` (the growing loop's
shapes: a sequence of one prompt, one token longer each call) and, one token per sequence, on
every batch size of ``--batches`` (a decode step whose batch varies). Each is compiled once with
``dynamic=True`` and every shape captured once; then, interleaved, eager, npugraph_ex (few-row
products split per key, ``capture/key_shapes.py``; the others through oneDNN where the host
probe says it pays, ``runtime/cpu/platform.py``), npugraph_ex with every key capturing
the graph as compiled (the specialiser switched off for that compile), and npugraph_ex with its
products left to ``mm`` (oneDNN switched off for that compile), and npugraph_ex replaying the
steps that depend on a key's sizes alone (``runtime/cpu/constants.py``, switched off for that
compile) run every shape ``--calls`` times per repeat.
Per band of shapes: ms per call, median over repeats, and each variant's speed-up over eager.

    python benchmarks/key_shapes.py
    python benchmarks/key_shapes.py --static-kernels --lengths 9 16 --batches 9 10
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from common import (
    add_common_args,
    apply_threads,
    attributes_set,
    format_table,
    median,
    print_heading,
    settings_of,
    time_calls,
    write_json,
)

from npugraph_ex import compiler
from npugraph_ex.bench.presets import build_qwen3
from npugraph_ex.bench.variants import own_code
from npugraph_ex.runtime.cpu import probes
from npugraph_ex.runtime.cpu.platform import SPLIT_MAX_ROWS as MAX_ROWS

NAME = "key_shapes"
VARIANTS = (
    "eager",
    "npugraph_ex",
    "npugraph_ex, keys as compiled",
    "npugraph_ex, products by mm",
    "npugraph_ex, constants replayed",
)


def compiled(
    step: Callable[..., Any],
    tag: str,
    without: tuple[Any, str, Any] | None,
    static_kernels: bool = False,
    **extra: Any,
) -> Callable[..., Any]:
    """``step`` compiled on its own code, with the options ``extra`` besides the bench's;
    ``without``: (module, name, value) set while it runs (its compile and captures happen in its
    first calls)."""
    options = {"capture_limit": 256, "static_kernel_compile": static_kernels, **extra}
    fn = torch.compile(own_code(step, tag), backend="npugraph_ex", dynamic=True, options=options)
    if without is None:
        return fn
    module, name, value = without

    def run(*args: Any) -> Any:
        with attributes_set(module, {name: value}):
            return fn(*args)

    return run


def measure(
    step: Callable[[torch.Tensor], Any],
    inputs: dict[int, torch.Tensor],
    repeats: int,
    calls: int,
    static_kernels: bool,
) -> dict[str, dict[int, float]]:
    """Seconds per call of each variant on each input, median of ``repeats`` interleaved rounds
    (every variant's first call of every input, compile and capture, comes first, untimed).
    With static kernels, whose keys are compiled for their sizes anyway, no variant switches
    the specialiser off."""
    fns = {
        "eager": step,
        "npugraph_ex": compiled(step, "default", None, static_kernels),
        "npugraph_ex, keys as compiled": compiled(
            step, "as_compiled", (compiler, "key_specialiser", lambda lowered: None)
        ),
        "npugraph_ex, products by mm": compiled(
            step, "by_mm", (probes, "linear_pays", lambda rows=None: False), static_kernels
        ),
        "npugraph_ex, constants replayed": compiled(
            step, "replayed", None, disabled_build_steps=["fold_constants"]
        ),
    }
    if static_kernels:
        del fns["npugraph_ex, keys as compiled"]
        del fns["npugraph_ex, constants replayed"]
    for fn in fns.values():
        for x in inputs.values():
            fn(x)
    times: dict[str, dict[int, list[float]]] = {v: {k: [] for k in inputs} for v in fns}
    order = list(fns.items())
    for round_ in range(repeats):
        # Each round starts with the next variant: no variant is always timed first or last.
        shift = round_ % len(order)
        for variant, fn in order[shift:] + order[:shift]:
            for size, x in inputs.items():
                times[variant][size].append(time_calls(lambda f=fn, a=x: f(a), calls))
    return {v: {k: median(t) for k, t in per.items()} for v, per in times.items()}


def bands(sizes: list[int]) -> list[tuple[str, list[int]]]:
    """The sizes the split reaches (up to ``MAX_ROWS``), the rest, and all."""
    few = [s for s in sizes if s <= MAX_ROWS]
    rest = [s for s in sizes if s > MAX_ROWS]
    named = [(f"{few[0]}-{few[-1]}", few)] if few else []
    named += [(f"{rest[0]}-{rest[-1]}", rest)] if rest else []
    return [*named, ("all", sizes)] if len(named) > 1 else named


def table(title: str, seconds: dict[str, dict[int, float]]) -> str:
    sizes = sorted(seconds["eager"])
    variants = [v for v in VARIANTS if v in seconds]
    rows = []
    for band, members in bands(sizes):
        total = {v: sum(seconds[v][s] for s in members) for v in variants}
        cells = [band, *(f"{total[v] / len(members) * 1e3:.2f}" for v in variants)]
        cells += [f"{total['eager'] / total[v]:.2f}x" for v in variants[1:]]
        rows.append(cells)
    headers = [title, *(f"{v} ms" for v in variants), *(f"{v} speed-up" for v in variants[1:])]
    return format_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs=2, default=[4, 35], metavar=("FIRST", "LAST"))
    parser.add_argument("--batches", type=int, nargs=2, default=[2, 12], metavar=("FIRST", "LAST"))
    parser.add_argument("--calls", type=int, default=5, help="calls per shape per repeat")
    parser.add_argument(
        "--static-kernels",
        action="store_true",
        help="compile with static_kernel_compile=True (Inductor per key: slow first calls)",
    )
    add_common_args(parser, NAME, repeats=7)
    args = parser.parse_args()
    apply_threads(args.threads)
    model = build_qwen3("tiny", seed=0).eval()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    def ids(shape: tuple[int, int]) -> torch.Tensor:
        return torch.randint(0, vocab, shape, generator=generator)

    first, last = args.lengths
    lengths = {n: ids((1, n)) for n in range(first, last + 1)}
    first, last = args.batches
    batches = {n: ids((n, 1)) for n in range(first, last + 1)}
    print_heading(
        f"ms per call, median of {args.repeats} interleaved repeats of {args.calls} calls "
        "per shape, averaged over each band of shapes"
    )
    results = {}
    with torch.no_grad():
        for name, inputs, title in (
            ("lengths", lengths, "sequence length"),
            ("batches", batches, "batch (one token each)"),
        ):
            torch._dynamo.reset()
            results[name] = measure(forward, inputs, args.repeats, args.calls, args.static_kernels)
            print(f"\n{table(title, results[name])}")
    write_json(args.out, NAME, settings_of(args), results)


if __name__ == "__main__":
    main()
