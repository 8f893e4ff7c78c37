"""How much memory do the keys of a growing-sequence loop take, with pools shared or per key, and
does the planned arena change replay speed?

The loop is greedy decoding without a KV cache: every call runs the whole sequence, so every new
length is a new graph key (``dynamic=True``), captured once. A tiny Qwen3 causal LM built from a
config with random weights.

Memory: each configuration runs in a fresh process: build the model, run it eagerly once at the
largest length, release freed heap (``malloc_trim``), read the resident set size; then compile,
run the loop for N keys keeping only the last call's logits, release freed heap again and read it
again. Reported: the pools' bytes (``npugraph_ex.stats()``), the resident growth, and the peak
resident growth (the kernel's high-water mark, reset before compiling). "largest key alone" is
one call at the loop's largest length: the yardstick of the target (64 keys with shared pools
within 1.5x of it).

Latency: in one process, the same keys captured three ways (one shared pool, a pool per key, no
pool: every tensor keeps its own allocation), then each variant's graphs replayed in turn, the
variants interleaved; time per replay.

    python benchmarks/pool_memory.py
    python benchmarks/pool_memory.py --keys 1 16 64 --plot docs/figures/pool_memory.png
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import (
    QWEN3_PRESETS,
    add_common_args,
    apply_threads,
    format_table,
    interleaved,
    median,
    print_heading,
    scaled,
    write_json,
)

from npugraph_ex.runtime.cpu.heap import release_free_heap

NAME = "pool_memory"
PROMPT = 4
MIB = 2**20


def build_model(preset: str) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**QWEN3_PRESETS[preset], max_position_embeddings=512)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen3ForCausalLM(config).eval()


def compile_loop(model: torch.nn.Module, **options: Any) -> Any:
    def forward(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    options = {"capture_limit": 256, **options}
    return torch.compile(
        forward, backend="npugraph_ex", fullgraph=True, dynamic=True, options=options
    )


def prompt_ids(model: torch.nn.Module, length: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, model.config.vocab_size, (1, length), generator=generator)


def greedy_loop(forward: Any, prompt: torch.Tensor, keys: int) -> None:
    """``keys`` calls over lengths len(prompt) .. len(prompt) + keys - 1; only the last logits
    stay referenced, as in a generation loop."""
    ids, logits = prompt, None
    for _ in range(keys):
        logits = forward(ids)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)


def status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def release_freed_heap() -> None:
    gc.collect()
    release_free_heap()


def reset_peak() -> bool:
    """Reset the kernel's resident high-water mark (VmHWM) to the current size."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def measure_child(preset: str, mode: str, keys: int, largest: int) -> dict[str, Any]:
    """One configuration, in this (fresh) process."""
    import npugraph_ex

    model = build_model(preset)
    with torch.no_grad():
        model(input_ids=prompt_ids(model, largest))
    release_freed_heap()
    before = status_kib("VmRSS")
    peak_known = reset_peak()
    forward = compile_loop(model, reuse_graph_pool_in_same_fx=mode != "per key")
    start = time.perf_counter()
    with torch.no_grad():
        if mode == "largest key alone":
            forward(prompt_ids(model, largest))
        else:
            greedy_loop(forward, prompt_ids(model, PROMPT), keys)
    seconds = time.perf_counter() - start
    release_freed_heap()
    totals = npugraph_ex.stats()["totals"]
    (graph,) = [g for g in npugraph_ex.stats()["graphs"] if g["captures"]]
    return {
        "mode": mode,
        "keys": graph["live_keys"],
        "pools": graph["pools"],
        "pool_bytes": totals["pool_bytes"],
        "largest_key_pool_bytes": max(k["pool_bytes"] for k in graph["keys"].values()),
        "resident_growth_bytes": (status_kib("VmRSS") - before) * 1024,
        "peak_growth_bytes": (status_kib("VmHWM") - before) * 1024 if peak_known else None,
        "seconds": round(seconds, 2),
    }


def run_child(args: argparse.Namespace, mode: str, keys: int) -> dict[str, Any]:
    largest = PROMPT + max(args.keys) - 1
    command = [sys.executable, __file__, "--child", mode, str(keys), str(largest)]
    command += ["--preset", args.preset] + (
        ["--threads", str(args.threads)] if args.threads else []
    )
    print(f"  measuring {mode}, {keys} key(s) ...", flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {mode} {keys} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory_part(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [run_child(args, "largest key alone", 1)]
    for mode in ("shared", "per key"):
        rows += [run_child(args, mode, keys) for keys in args.keys]
    return rows


def capture_variant(model: torch.nn.Module, keys: int, *, mode: str) -> list[Any]:
    """Capture ``keys`` lengths one way; the capture managers (kept alive by the caller)."""
    from npugraph_ex.capture.stats import LIVE_GRAPHS

    before = set(LIVE_GRAPHS.keys())
    forward = compile_loop(
        model,
        reuse_graph_pool_in_same_fx=mode == "shared pool",
        disabled_build_steps=["place"] if mode == "no pool" else [],
    )
    with torch.no_grad():
        greedy_loop(forward, prompt_ids(model, PROMPT), keys)
    fresh = [LIVE_GRAPHS.get(n) for n in LIVE_GRAPHS.keys() if n not in before]
    torch._dynamo.reset()  # later variants compile afresh; these managers stay alive here
    return [m for m in fresh if m is not None and m.entries]


def replay_block(managers: list[Any]) -> Any:
    """Replay every key's graph in turn. Each first sets its token inputs to 0: a key's input
    buffers share the pool's bytes with intermediates, so what a replay left there is no valid
    token id (a replay through the manager copies the caller's ids in; the zeros cost the same
    in every variant)."""
    keys = [(entry.graph, entry.staged.copies) for m in managers for entry in m.entries.values()]

    def block() -> float:
        start = time.perf_counter()
        for graph, copies in keys:
            for _, buffer in copies:
                buffer.zero_()
            graph.replay()
        return (time.perf_counter() - start) / len(keys)

    return block


def latency_part(args: argparse.Namespace) -> dict[str, list[float]]:
    model = build_model(args.preset)
    variants = ("no pool", "shared pool", "pool per key")
    managers = {mode: capture_variant(model, args.latency_keys, mode=mode) for mode in variants}
    blocks = {mode: replay_block(managers[mode]) for mode in variants}
    with torch.no_grad():
        return interleaved(blocks, args.repeats, warmup=1)


def memory_table(rows: list[dict[str, Any]]) -> str:
    base = rows[0]
    headers = [
        "pools",
        "keys",
        "pool MiB",
        "resident MiB",
        "peak MiB",
        "pool / largest",
        "resident / largest",
    ]
    table = []
    for row in rows:
        peak = row["peak_growth_bytes"]
        table.append(
            [
                row["mode"],
                row["keys"],
                row["pool_bytes"] / MIB,
                row["resident_growth_bytes"] / MIB,
                peak / MIB if peak is not None else "n/a",
                f"{row['pool_bytes'] / base['pool_bytes']:.2f}x",
                f"{row['resident_growth_bytes'] / base['resident_growth_bytes']:.2f}x",
            ]
        )
    return format_table(headers, table)


def latency_table(times: dict[str, list[float]]) -> str:
    base = median(times["no pool"])
    rows = [[mode, median(ts) * 1e3, f"{base / median(ts):.2f}x"] for mode, ts in times.items()]
    return format_table(["capture", "ms per replay", "speed vs no pool"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(QWEN3_PRESETS), default="tiny")
    parser.add_argument("--keys", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--latency-keys", type=int, default=16)
    parser.add_argument("--plot", type=Path, help="write a PNG chart here")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--replot", type=Path, help="only redraw --plot from this JSON record")
    add_common_args(parser, NAME, repeats=15)
    args = parser.parse_args()
    apply_threads(args.threads)
    if args.child:
        mode, keys, largest = args.child
        print(json.dumps(measure_child(args.preset, mode, int(keys), int(largest))))
        return
    if args.replot:
        results = json.loads(args.replot.read_text())["results"]
        times = {m: [t / 1e3 for t in ts] for m, ts in results["latency_per_repeat_ms"].items()}
        plot(results["memory"], times, args.plot or Path("pool_memory.png"))
        return
    print("memory (one fresh process per row):", flush=True)
    rows = memory_part(args)
    print("latency:", flush=True)
    times = latency_part(args)
    print_heading(f"growing-sequence loop from a {PROMPT}-token prompt, preset {args.preset}")
    print(memory_table(rows))
    print("\nresident = growth of the resident set after the loop (freed heap released); peak =")
    print(
        "growth of its high-water mark. pool / largest, resident / largest: against the first row."
    )
    print(
        f"\nreplay latency, {args.latency_keys} keys, median of {args.repeats} interleaved repeats"
    )
    print(latency_table(times))
    settings = {"preset": args.preset, "keys": args.keys, "latency_keys": args.latency_keys}
    results = {
        "memory": rows,
        "latency_per_repeat_ms": {m: scaled(ts, 1e3) for m, ts in times.items()},
        "latency_median_ms": {m: round(median(ts) * 1e3, 4) for m, ts in times.items()},
    }
    write_json(args.out, NAME, settings, results)
    if args.plot:
        plot(rows, times, args.plot)


def plot(rows: list[dict[str, Any]], times: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    panels = (("pool_bytes", "pool bytes"), ("resident_growth_bytes", "resident growth"))
    for ax, (field, title) in zip(axes[:2], panels, strict=True):
        base = rows[0][field] / MIB
        for mode, colour in (("shared", "#1f77b4"), ("per key", "#ff7f0e")):
            picked = [r for r in rows if r["mode"] == mode]
            ax.plot(
                [r["keys"] for r in picked],
                [r[field] / MIB for r in picked],
                "o-",
                color=colour,
                label=mode,
            )
        ax.axhline(base, color="#8c8c8c", ls=":", label="largest key alone")
        ax.axhline(base * 1.5, color="#2ca02c", ls=":", label="1.5x largest key alone")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("captured keys")
        ax.set_ylabel("MiB")
        ax.set_title(title)
        ax.legend(fontsize=8)
    names = list(times)
    mids = [median(times[n]) * 1e3 for n in names]
    axes[2].bar(names, mids, color=["#8c8c8c", "#1f77b4", "#ff7f0e"])
    for i, mid in enumerate(mids):
        axes[2].text(i, mid / 2, f"{mid:.2f} ms\n{mids[0] / mid:.2f}x", ha="center", fontsize=9)
    axes[2].set_ylabel("ms per replay")
    axes[2].set_title("replay latency")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
