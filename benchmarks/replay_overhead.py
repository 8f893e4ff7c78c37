"""What does one op cost the host, in eager mode and in an npugraph_ex replay, beyond its kernel?

The workload is a chain of N tiny elementwise ops on a 16-float tensor (add, mul, sub, relu in
turn, so no two neighbours cancel or fold), for which compute is negligible and the per-op cost is
almost all host overhead. Timed in one interleaved loop, per call of the chain:

- eager: the plain Python function;
- npugraph_ex: ``torch.compile(chain, backend="npugraph_ex", fullgraph=True)``;
- capture manager: the capture manager called directly, as the wrappers call it (graph-key lookup,
  copies of the inputs into the graph's static buffers, replay);
- replay-only: the captured graph's bare ``replay()``;
- step loop: the same recorded steps run by a plain Python loop instead of the replay's generated
  function;
- kernels: the sum of the chain's kernels each timed alone in a tight loop through the public
  out= API (``torch.add(a, b, out=c)``; relu as ``torch.clamp_min(a, 0, out=c)``, the kernel
  relu runs), i.e. the least a Python caller can pay to run each kernel once;
- kernels (profiler): the ATen ops' self CPU time in a replay under torch.profiler, a second kernel
  figure that leaves out the Python-to-C++ call of each op (and adds some of the profiler's own
  cost).

    python benchmarks/replay_overhead.py
    python benchmarks/replay_overhead.py --ops 10 50 100 400 1000 --repeats 30
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from common import (
    add_common_args,
    apply_threads,
    aten_self_times,
    captured_graph,
    format_table,
    interleaved,
    kernels_per_replay,
    live_graph_numbers,
    median,
    print_heading,
    scaled,
    settings_of,
    spread,
    step_loop,
    time_calls,
    write_json,
)

NAME = "replay_overhead"
OPS = ("add", "mul", "sub", "relu")


def make_chain(n: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``n`` elementwise ops on ``x`` cycling add, mul, sub, relu."""

    def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for i in range(n):
            kind = i % 4
            if kind == 0:
                x = x + y
            elif kind == 1:
                x = x * y
            elif kind == 2:
                x = x - y
            else:
                x = torch.relu(x)
        return x

    return chain


def op_counts(n: int) -> dict[str, int]:
    return {op: len(range(i, n, len(OPS))) for i, op in enumerate(OPS)}


def kernel_calls(numel: int) -> dict[str, Callable[[], Any]]:
    """Each op's kernel alone, writing into a preallocated output."""
    a, b, out = torch.rand(numel) + 0.5, torch.rand(numel) + 0.5, torch.empty(numel)
    return {
        "add": lambda: torch.add(a, b, out=out),
        "mul": lambda: torch.mul(a, b, out=out),
        "sub": lambda: torch.sub(a, b, out=out),
        "relu": lambda: torch.clamp_min(a, 0.0, out=out),
    }


def calls_block(fn: Callable[[], Any], calls: int) -> Callable[[], float]:
    return lambda: time_calls(fn, calls)


def kernels_block(n: int, numel: int, iters: int) -> Callable[[], float]:
    """Seconds of the chain's kernels: each kind timed alone, times how often it occurs."""
    calls, counts = kernel_calls(numel), op_counts(n)
    return lambda: sum(time_calls(calls[op], iters) * counts[op] for op in OPS if counts[op])


def profiler_block(graph: Any, replays: int) -> Callable[[], float]:
    """Seconds of ATen self CPU time per replay, from a profiled run of ``replays`` replays."""
    return lambda: sum(aten_self_times(graph.replay, replays)[0].values())


def run_chain(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Check numerics, then time every variant of an ``n``-op chain, interleaved."""
    torch._dynamo.reset()
    chain = make_chain(n)
    compiled = torch.compile(chain, backend="npugraph_ex", fullgraph=True)
    x, y = torch.rand(args.numel), torch.rand(args.numel) * 0.5 + 0.5
    before = live_graph_numbers()
    outputs = [compiled(x, y).clone() for _ in range(3)]  # capture, then replays
    manager, graph = captured_graph(before)
    outputs.append(manager([x, y])[0].clone())  # the manager alone, as the wrappers call it
    equal = all(torch.equal(out, chain(x, y)) for out in outputs)
    calls = max(args.min_calls, args.op_budget // n)
    profiled = max(args.min_calls // 4, args.profile_ops // n)
    blocks = {
        "eager": calls_block(lambda: chain(x, y), calls),
        "npugraph_ex": calls_block(lambda: compiled(x, y), calls),
        "capture manager": calls_block(lambda: manager([x, y]), calls),
        "replay-only": calls_block(graph.replay, calls),
        "step loop": calls_block(step_loop(graph), calls),
        "kernels": kernels_block(n, args.numel, args.kernel_iters),
        "kernels (profiler)": profiler_block(graph, profiled),
    }
    times = interleaved(blocks, args.repeats, warmup=args.warmup)
    us = {name: median(ts) * 1e6 for name, ts in times.items()}
    by_op, _ = aten_self_times(graph.replay, profiled)
    return {
        "ops": n,
        "op_counts": op_counts(n),
        "calls_per_block": calls,
        "equal_to_eager": equal,
        "kernels_per_replay": kernels_per_replay(manager.stats.summary(), graph),
        "stats": manager.stats.summary(),
        "per_repeat_us": {name: scaled(ts, 1e6, 3) for name, ts in times.items()},
        "median_us": {name: round(v, 3) for name, v in us.items()},
        "spread": {name: round(spread(ts), 3) for name, ts in times.items()},
        "replays_per_profile": profiled,
        "profiler_self_us_per_replay": {k: round(v * 1e6, 3) for k, v in by_op.items()},
        "host_us_per_op": host_overheads(us, n),
        "fixed_us_per_call": round(us["npugraph_ex"] - us["replay-only"], 3),
        "fixed_us_split": {
            "dynamo + aot wrappers": round(us["npugraph_ex"] - us["capture manager"], 3),
            "capture manager": round(us["capture manager"] - us["replay-only"], 3),
        },
    }


def host_overheads(us: dict[str, float], n: int) -> dict[str, float]:
    """(variant - kernel sum) / n for eager and replay, against both kernel figures."""
    result = {}
    for variant in ("replay-only", "eager"):
        for kernels in ("kernels", "kernels (profiler)"):
            label = f"{variant} - {kernels}"
            result[label] = round((us[variant] - us[kernels]) / n, 4)
    return result


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``: returns (a, b)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def fits(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per-call fixed cost (intercept) and per-op cost (slope) of each variant over N."""
    ns = [r["ops"] for r in results]
    out = {}
    for name in results[0]["median_us"]:
        fixed, per_op = line_fit(ns, [r["median_us"][name] for r in results])
        out[name] = {"fixed_us": round(fixed, 3), "us_per_op": round(per_op, 4)}
    return out


TIMING_COLUMNS = {
    "eager us": lambda r: r["median_us"]["eager"],
    "npugraph_ex us": lambda r: r["median_us"]["npugraph_ex"],
    "manager us": lambda r: r["median_us"]["capture manager"],
    "replay-only us": lambda r: r["median_us"]["replay-only"],
    "step loop us": lambda r: r["median_us"]["step loop"],
    "kernels us": lambda r: r["median_us"]["kernels"],
    "kernels (profiler) us": lambda r: r["median_us"]["kernels (profiler)"],
    "speed-up": lambda r: f"{r['median_us']['eager'] / r['median_us']['npugraph_ex']:.2f}x",
    "kernels/replay": lambda r: r["kernels_per_replay"],
    "equal": lambda r: r["equal_to_eager"],
    "spread": lambda r: f"{max(r['spread'].values()) * 100:.0f}%",
}

OVERHEAD_COLUMNS = {
    "replay host us/op": lambda r: r["host_us_per_op"]["replay-only - kernels"],
    "eager host us/op": lambda r: r["host_us_per_op"]["eager - kernels"],
    "replay (profiler)": lambda r: r["host_us_per_op"]["replay-only - kernels (profiler)"],
    "eager (profiler)": lambda r: r["host_us_per_op"]["eager - kernels (profiler)"],
    "fixed us/call": lambda r: r["fixed_us_per_call"],
    "Dynamo+AOT us": lambda r: r["fixed_us_split"]["dynamo + aot wrappers"],
    "manager us": lambda r: r["fixed_us_split"]["capture manager"],
}


def table(results: list[dict[str, Any]], columns: dict[str, Callable[[dict], Any]]) -> str:
    rows = [[r["ops"], *(cell(r) for cell in columns.values())] for r in results]
    return format_table(["N ops", *columns], rows)


def report(results: list[dict[str, Any]], fit: dict, args: argparse.Namespace) -> None:
    print_heading(
        f"chain of N elementwise ops on {args.numel} floats; median of {args.repeats} interleaved "
        "repeats; times are per call of the whole chain"
    )
    print(table(results, TIMING_COLUMNS))
    print()
    print(table(results, OVERHEAD_COLUMNS))
    if fit:
        print()
        rows = [[k, v["fixed_us"], v["us_per_op"]] for k, v in fit.items()]
        print(format_table(["variant", "fit: fixed us/call", "fit: us/op"], rows))
    print(EXPLANATION)


EXPLANATION = """
manager = the capture manager called directly (key lookup, input copies, replay).
host us/op = (variant - kernels) / N: what each op costs beyond its kernel. "kernels" sums each
kernel timed alone in a tight loop through the public out= API (torch.add(a, b, out=c); relu as
clamp_min, the kernel relu runs), so it still includes one Python-to-C++ call per kernel;
"(profiler)" uses the ATen ops' self CPU time under torch.profiler instead, which leaves that
call out (and adds some of the profiler's own cost).
fixed us/call = npugraph_ex - replay-only: what a call costs outside the replay. It splits into
Dynamo + AOT (npugraph_ex - manager: guards and the AOTAutograd runtime wrapper) and manager
(manager - replay-only). The fit is least squares of time = fixed + N * us/op over the N run."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ops", type=int, nargs="+", default=[10, 100, 400], help="chain lengths")
    parser.add_argument("--numel", type=int, default=16, help="elements of the tensor")
    parser.add_argument(
        "--op-budget", type=int, default=40000, help="ops per timed block (calls = budget / N)"
    )
    parser.add_argument("--min-calls", type=int, default=40, help="least calls per timed block")
    parser.add_argument(
        "--kernel-iters", type=int, default=4000, help="tight-loop iterations per kernel"
    )
    parser.add_argument(
        "--profile-ops", type=int, default=4000, help="ops per profiled block (replays = ops / N)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds before timing")
    add_common_args(parser, NAME, repeats=21)
    args = parser.parse_args(argv)
    if min(args.ops) < 1 or args.numel < 1:
        parser.error("--ops and --numel must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    apply_threads(args.threads)
    with torch.no_grad():
        results = [run_chain(n, args) for n in args.ops]
    fit = fits(results) if len(results) > 1 else {}
    report(results, fit, args)
    write_json(args.out, NAME, settings_of(args), {"chains": results, "fit": fit})


if __name__ == "__main__":
    main()
