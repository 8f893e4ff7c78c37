"""Where the growing loop's peak GPU memory comes from, backend by backend.

The first run of the growing loop (tiny Qwen3, 4-token prompt + 16 tokens, ``dynamic=True``)
under eager, ``aot_eager`` and npugraph_ex, with the CUDA caching allocator recording every
allocation and its Python stack (``torch.cuda.memory._record_memory_history``). For each
backend: the peak bytes allocated during the run (above what was allocated before it), and the
largest allocations alive at that peak, each with the innermost frames of the code that made
it. An allocation made by Dynamo, AOTAutograd or transformers and shared by every compiled
backend is not npugraph_ex's; one under ``npugraph_ex/`` is.

    python benchmarks/growing_peak.py --out "$OUT/growing_peak.json"     # on a GPU
    python benchmarks/growing_peak.py --device cpu                       # the loops only
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.bench.growing import prompt_ids
from npugraph_ex.bench.presets import build_qwen3

BACKENDS = ("eager", "aot_eager", "npugraph_ex")
MIB = 1 << 20


def apply(entry: dict[str, Any], live: dict[int, dict[str, Any]]) -> int:
    """Track one allocator trace entry; the change in bytes allocated."""
    if entry["action"] == "alloc":
        live[entry["addr"]] = entry
        return entry["size"]
    if entry["action"] == "free_completed" and entry["addr"] in live:
        return -live.pop(entry["addr"])["size"]
    return 0


def peak_allocations(trace: Sequence[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """The peak of bytes allocated over ``trace`` (above its start) and the allocations alive
    at that peak, largest first."""
    current = peak = 0
    peak_at = -1
    live: dict[int, dict[str, Any]] = {}
    for index, entry in enumerate(trace):
        current += apply(entry, live)
        if current > peak:
            peak, peak_at = current, index
    live = {}
    for entry in trace[: peak_at + 1]:
        apply(entry, live)
    return peak, sorted(live.values(), key=lambda e: e["size"], reverse=True)


def where(entry: dict[str, Any], frames: int = 4) -> list[str]:
    """The innermost Python frames of an allocation, as ``file:line name``."""
    shown = []
    for frame in entry.get("frames", []):
        name = frame.get("filename", "?")
        if not name.endswith(".py"):
            continue  # C++ frames
        short = "/".join(name.split("/")[-3:])
        shown.append(f"{short}:{frame.get('line', '?')} {frame.get('name', '?')}")
        if len(shown) == frames:
            break
    return shown


def growing_run(model: torch.nn.Module, backend: str, device: str, tokens: int) -> None:
    def step(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    fn = step
    if backend != "eager":
        options = {"options": {"capture_limit": tokens}} if backend == "npugraph_ex" else {}
        fn = torch.compile(step, backend=backend, dynamic=True, **options)
    ids = prompt_ids(model.config.vocab_size, 4, seed=0, device=device)
    with torch.no_grad():
        for _ in range(tokens):
            picked = fn(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, picked], dim=1)


def trace_length(device: str) -> int:
    if device != "cuda":
        return 0
    return len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])


def measure(model: torch.nn.Module, backend: str, device: str, tokens: int) -> dict[str, Any]:
    torch._dynamo.reset()
    start = trace_length(device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    growing_run(model, backend, device, tokens)
    if device != "cuda":
        return {"backend": backend, "peak_mib": None, "largest": []}
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()][start:]
    peak, live = peak_allocations(trace)
    largest = [{"mib": e["size"] / MIB, "where": where(e)} for e in live[:5]]
    return {
        "backend": backend,
        "peak_mib": (torch.cuda.max_memory_allocated() - before) / MIB,
        "traced_peak_mib": peak / MIB,
        "largest": largest,
    }


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "| variant | peak MiB above start | largest allocation at the peak |",
        "|---|---:|---|",
    ]
    for r in results:
        top = r["largest"][0] if r["largest"] else None
        cell = f"{top['mib']:.1f} MiB at {' < '.join(top['where'][:2])}" if top else "-"
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.1f}"
        lines.append(f"| {r['backend']} | {peak} | {cell} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "growing_peak.json")
    args = parser.parse_args()
    if args.device == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    model = build_qwen3("tiny", seed=0, device=args.device)
    results = [measure(model, b, args.device, args.tokens) for b in BACKENDS]
    print(f"growing loop, tiny Qwen3, 4 + {args.tokens} tokens, first run on {args.device}")
    print(report(results))
    for r in results:
        for allocation in r["largest"]:
            shown = " < ".join(allocation["where"])
            print(f"at the peak, {r['backend']}: {allocation['mib']:.1f} MiB: {shown}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
