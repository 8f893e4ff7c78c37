"""Where a call's time goes, eager against npugraph_ex: kernels, host overhead, the hardware floor.

Three workloads of one Qwen3 (``--preset``, random weights), each a fixed shape:

- *decode*: one token with a ``StaticCache`` (the decode step of ``npugraph-ex bench``);
- *one token*: one token without a cache (``use_cache=False``);
- *prefix N*: ``--prefix`` tokens without a cache, a middle length of the growing loop.

Per workload, timed in one interleaved loop (median per call):

- *eager*: the model's forward;
- *npugraph_ex*: the compiled forward (default options);
- *replay in the call*: the time the compiled calls spend inside the capture manager (key lookup,
  input copies and the replay), clocked in place;
- *in AOTAutograd's call*: the time they spend inside the function the backend returned to Dynamo
  (AOTAutograd's runtime wrapper around the capture manager), clocked in place;
- *replay*: the capture manager called alone, back to back, on the arguments the compiled call
  gives it (recorded for comparison: alone, its code and data stay in the caches, so it runs
  faster than in the call);
- *kernels*: the captured ATen calls alone, in a plain loop over the recorded steps: what a
  replay of these kernels cannot go below on this CPU, whatever its host code;

and, for eager, the ATen ops' self time under ``torch.profiler`` (the rest is the model's Python
around them). npugraph_ex's time splits into kernels, the engine and manager (replay in the call
- kernels), AOTAutograd's wrapper (in AOTAutograd's call - replay in the call) and Dynamo's frame
and guards (npugraph_ex - in AOTAutograd's call).

The *floor* is the larger of two: the bytes of the weights a call reads at the memory bandwidth
measured here (a sum over a buffer much larger than the caches), and the arithmetic of its
matrix products (2 x rows x weight elements) at the rate this host's ``sgemm`` reaches on large
matrices (2048 x 2048, measured here). No runtime, fusion or kernel compiler keeping fp32
weights goes below it: one row is bound by the reads, a prefix of many rows by the arithmetic.

Ceilings: eager / kernels is the most a replay of the same ATen calls can gain (every host cost
gone); eager / floor the most anything can. Each ATen call has a fixed cost besides its work
(about 1.2 us here: ``replay_overhead.py``), which only fewer, fused kernels remove.

    python benchmarks/breakdown.py --plot docs/figures/breakdown.png
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from common import (
    QWEN3_PRESETS,
    add_common_args,
    apply_threads,
    aten_self_times,
    calls_through,
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
from npugraph_ex.dynamo_backend import npugraph_ex_backend

NAME = "breakdown"
CACHE_LENGTH = 128


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME, repeats=9)
    parser.add_argument("--preset", choices=sorted(QWEN3_PRESETS), default="tiny")
    parser.add_argument("--prefix", type=int, default=20, help="tokens of the prefix workload")
    parser.add_argument("--calls", type=int, default=50, help="calls per timed block")
    parser.add_argument("--plot", default=None, help="write a PNG chart here")
    return parser.parse_args(argv)


def bandwidth_bytes_per_second(megabytes: int = 512) -> float:
    """Best of five sums over a buffer far larger than the caches: what streaming reads reach."""
    buffer = torch.ones(megabytes * 1024 * 1024 // 4)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best


def gemm_flops_per_second(size: int = 2048) -> float:
    """Best of five large square ``mm`` calls: the arithmetic rate this host's BLAS reaches."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The weights one forward reads whole: every linear layer's (the embedding table is read
    one row per token)."""
    return [p for m in model.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters()]


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in linear_weights(model))


def workloads(model: torch.nn.Module, prefix: int) -> dict[str, tuple[Callable, Callable, int]]:
    """Each workload as a factory of ``(fn) -> call`` closures over fixed inputs, what to do
    before a run of calls (the decode step's cache goes back to empty: a block of calls must
    stay within its length), and how many rows its matrix products have."""
    from transformers import StaticCache

    from npugraph_ex.bench.decode import cache_keyword

    keyword = cache_keyword(model)
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    one = torch.tensor([[1]])
    tokens = torch.arange(prefix)[None] % model.config.vocab_size
    position = torch.tensor([0])

    def decode(fn: Callable) -> Callable:
        return lambda: fn(
            input_ids=one, cache_position=position, use_cache=True, **{keyword: cache}
        )

    def one_token(fn: Callable) -> Callable:
        return lambda: fn(input_ids=one, use_cache=False)

    def prefix_run(fn: Callable) -> Callable:
        return lambda: fn(input_ids=tokens, use_cache=False)

    def nothing() -> None:
        pass

    return {
        "decode": (decode, cache.reset, 1),
        "one token": (one_token, nothing, 1),
        f"prefix {prefix}": (prefix_run, nothing, prefix),
    }


def measure(
    workload: Callable, reset: Callable, model: torch.nn.Module, args: argparse.Namespace
) -> dict:
    eager = workload(model)
    before = live_graph_numbers()
    in_aot = InCallClock()

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        return in_aot.clocked(npugraph_ex_backend(gm, example_inputs))

    compiled = workload(torch.compile(model, backend=backend, dynamic=False))
    compiled()
    compiled()
    manager, args_in = manager_arguments(managers_since(before), compiled)
    graph = next(iter(manager.entries.values())).graph
    calls = {
        "eager": eager,
        "npugraph_ex": compiled,
        "replay": lambda: manager(list(args_in)),
        "kernels": with_inputs(manager, args_in, step_loop(graph)),
    }

    def block(call: Callable) -> Callable[[], float]:
        def run() -> float:
            reset()
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            return (time.perf_counter() - start) / args.calls

        return run

    in_manager = InCallClock()
    blocks = {name: block(call) for name, call in calls.items()}
    blocks["replay in the call"] = in_manager.block(compiled, reset, args.calls)
    blocks["in AOTAutograd's call"] = in_aot.block(compiled, reset, args.calls)
    with calls_through(manager, in_manager.clocked):
        times = interleaved(blocks, args.repeats)
    reset()
    eager_self = sum(aten_self_times(eager, args.calls)[0].values())
    return {
        "ms": {name: median(t) * 1e3 for name, t in times.items()},
        "raw_s": times,
        "eager_aten_ms": eager_self * 1e3,
        "kernels_per_replay": next(iter(manager.entries.values())).graph.kernel_count,
    }


class InCallClock:
    """Seconds spent inside one function while the compiled call runs, clocked in place.

    The capture manager's replay runs between Dynamo's frame and AOTAutograd's wrapper, which
    leave less of its code and data in the caches than replays back to back do (alone, the same
    replay runs faster, and the difference of the two timings would charge that to the wrapper);
    the same holds for AOTAutograd's wrapper inside Dynamo's frame."""

    def __init__(self) -> None:
        self.spent = 0.0

    def clocked(self, fn: Callable) -> Callable:
        """``fn`` with its time added to this clock (attributes such as ``_boxed_call`` kept)."""

        @functools.wraps(fn)
        def clocked(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.spent += time.perf_counter() - start

        return clocked

    def block(self, call: Callable, reset: Callable, calls: int) -> Callable[[], float]:
        """A timed block of ``calls`` compiled calls that returns the time inside the function."""

        def run() -> float:
            reset()
            self.spent = 0.0
            for _ in range(calls):
                call()
            return self.spent / calls

        return run


PARTS = ("kernels", "outside ATen", "engine and manager", "AOTAutograd", "Dynamo")
"""A call's time, in order. Eager: its ATen ops (profiler self time), then the rest (the model's
Python). npugraph_ex: the captured kernels called in a plain loop, the replay program and the
capture manager around them, AOTAutograd's runtime wrapper, Dynamo's frame and guards."""


def derived(result: dict, floors_ms: dict[str, float]) -> dict[str, Any]:
    floor_ms = max(floors_ms.values())
    ms = result["ms"]
    eager = {
        "kernels": result["eager_aten_ms"],
        "outside ATen": ms["eager"] - result["eager_aten_ms"],
    }
    replay = {
        "kernels": ms["kernels"],
        "engine and manager": ms["replay in the call"] - ms["kernels"],
        "AOTAutograd": ms["in AOTAutograd's call"] - ms["replay in the call"],
        "Dynamo": ms["npugraph_ex"] - ms["in AOTAutograd's call"],
    }
    return {
        "parts": {
            "eager": {p: eager.get(p, 0.0) for p in PARTS},
            "npugraph_ex": {p: replay.get(p, 0.0) for p in PARTS},
        },
        "floor ms": floor_ms,
        "floors ms": floors_ms,
        "speed-up": ms["eager"] / ms["npugraph_ex"],
        "ceiling, no host": ms["eager"] / ms["kernels"],
        "ceiling, floor": ms["eager"] / floor_ms,
    }


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(PARTS, ("#4c72b0", "#dd8452", "#8172b3", "#937860", "#c44e52"), strict=True))
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 4.4))
    for ax, (name, result) in zip(axes, results.items(), strict=True):
        parts = result["derived"]["parts"]
        bottoms = dict.fromkeys(parts, 0.0)
        for part in PARTS:
            heights = [max(parts[v][part], 0.0) for v in parts]
            ax.bar(
                list(parts), heights, bottom=list(bottoms.values()), color=colors[part], label=part
            )
            bottoms = {v: b + h for (v, b), h in zip(bottoms.items(), heights, strict=True)}
        floor = result["derived"]["floor ms"]
        ax.axhline(floor, color="black", linestyle="--", label="floor: reads or arithmetic")
        ax.set_title(f"{name}: npugraph_ex {result['derived']['speed-up']:.2f}x eager")
        ax.set_ylabel("ms per call")
    axes[0].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for name, result in results.items():
        d, ms = result["derived"], result["ms"]
        for variant, parts in d["parts"].items():
            total = ms["eager"] if variant == "eager" else ms["npugraph_ex"]
            cells = [f"{parts[p]:.3f}" for p in PARTS]
            ratios = (
                [
                    f"{d['speed-up']:.2f}x",
                    f"{d['ceiling, no host']:.2f}x",
                    f"{d['ceiling, floor']:.2f}x",
                ]
                if variant != "eager"
                else ["", "", ""]
            )
            floor = f"{d['floor ms']:.3f}" if variant == "eager" else ""
            rows.append([name, variant, f"{total:.3f}", *cells, floor, *ratios])
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    apply_threads(args.threads)
    model = build_qwen3(args.preset, seed=0, positions=CACHE_LENGTH)
    bandwidth, flops = bandwidth_bytes_per_second(), gemm_flops_per_second()
    elements = sum(p.numel() for p in linear_weights(model))
    results: dict[str, Any] = {}
    with torch.no_grad():
        for name, (workload, reset, rows) in workloads(model, args.prefix).items():
            torch._dynamo.reset()
            results[name] = measure(workload, reset, model, args)
            floors = {
                "reads": weight_bytes(model) / bandwidth * 1e3,
                "arithmetic": 2 * rows * elements / flops * 1e3,
            }
            results[name]["derived"] = derived(results[name], floors)
    print_heading(
        f"Qwen3 {args.preset}: {weight_bytes(model) / 2**20:.1f} MiB of linear weights; "
        f"streaming read {bandwidth / 1e9:.1f} GB/s; sgemm {flops / 1e9:.0f} GFLOP/s; floors "
        + ", ".join(
            f"{name} {r['derived']['floors ms']['reads']:.3f} ms reads / "
            f"{r['derived']['floors ms']['arithmetic']:.3f} ms arithmetic"
            for name, r in results.items()
        )
    )
    header = [
        "workload", "variant", "ms per call", *(f"{p} ms" for p in PARTS), "floor ms",
        "speed-up", "ceiling: no host", "ceiling: floor",
    ]  # fmt: skip
    print(format_table(header, table_rows(results)))
    if args.plot:
        plot(results, args.plot)
    settings = settings_of(args)
    rates = {"bandwidth_bytes_per_s": bandwidth, "sgemm_flops_per_s": flops}
    write_json(args.out, NAME, settings, {**rates, **results})


if __name__ == "__main__":
    main()
