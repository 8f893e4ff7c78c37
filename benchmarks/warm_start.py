"""How long from process start to the first result, cold and warm, with the compile cache?

Every measurement is a fresh process: import torch, transformers and npugraph_ex, build a Qwen3
model (random weights, fixed seed), compile and call. Modes, side by side in one run:

- ``eager``: no compile, the floor.
- ``npugraph_ex-cold`` / ``npugraph_ex-warm``: ``npugraph_ex.inference.cache_compile`` on an empty
  cache folder, then, in the next process, on the folder the cold one filled.
- ``npugraph_ex``: ``torch.compile(backend="npugraph_ex")`` without the cache, for reference.
- ``inductor-cold`` / ``inductor-warm``: ``torch.compile(backend="inductor")`` with PyTorch's own
  caches: a fresh ``TORCHINDUCTOR_CACHE_DIR``, then the same folder again (FX graph and
  AOTAutograd caches) plus the cold process's ``torch.compiler.save_cache_artifacts()`` loaded
  with ``load_cache_artifacts`` (mega-cache). Slow to compile here: by default for ``tiny`` only.

Workloads: ``growing`` (greedy tokens without a KV cache, ``dynamic=True``, a new length per
step) and ``decode`` (an eager prefill into a ``StaticCache``, then one-token steps, static
shapes, ``dynamic=False``). *first call* is creating the compiled callable (loading the
mega-cache included) and its first call; *start -> first* runs from the parent's spawn to that
call's result. Each child checks its tokens and logits against eager's in the same process and
counts the graphs Dynamo traced. Each repeat runs the modes in turn, cold before warm, in
alternating order; figures are medians over repeats.

    python benchmarks/warm_start.py --plot docs/figures/warm_start.png
    python benchmarks/warm_start.py --model qwen3-0.6b --repeats 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STARTED = time.time()
"""The child's first clock read, before torch is imported."""

NAME = "warm_start"
PROMPT_TOKENS = 4
ARTIFACTS = "inductor_artifacts.bin"
CACHED = ("npugraph_ex-cold", "npugraph_ex-warm")
UNITS = (("eager",), CACHED, ("npugraph_ex",), ("inductor-cold", "inductor-warm"))
"""Modes in run order; a unit's modes share a cache folder and always run in this order."""
MODES = tuple(mode for unit in UNITS for mode in unit)
CHILD_SETTINGS = ("model", "tokens", "steps", "max_cache_len", "seed", "threads")
COLUMNS = (
    ("start -> first s", "start_to_first_s"),
    ("imports s", "imports_s"),
    ("build s", "build_s"),
    ("first call s", "first_call_s"),
    ("captures s", "captures_s"),
    ("start -> end s", "start_to_end_s"),
    ("Dynamo graphs", "dynamo_graphs"),
    ("cache", "cache"),
)
"""The table's columns after workload and mode: title, summary key."""


def compiled(mode: str, model: Any, dynamic: bool, options: dict[str, Any], root: Path) -> Any:
    """``model.forward`` as ``mode`` runs it; the caches live under ``root``."""
    import torch

    if mode == "eager":
        return model.forward
    if mode in CACHED:
        import npugraph_ex.inference

        return npugraph_ex.inference.cache_compile(
            model.forward, cache_dir=root / "npugraph_ex", dynamic=dynamic, options=options
        )
    if mode == "inductor-warm":
        torch.compiler.load_cache_artifacts((root / ARTIFACTS).read_bytes())
    backend, extra = (
        ("npugraph_ex", {"options": options}) if mode == "npugraph_ex" else ("inductor", {})
    )
    return torch.compile(model.forward, backend=backend, dynamic=dynamic, fullgraph=True, **extra)


def run_growing(make: Any, prompt: Any, tokens: int) -> tuple[Any, list[Any], list[float]]:
    """Greedy ``tokens`` over the whole sequence each step: the ids, the last position's logits
    of each step, and the clock before the first step and after each."""
    import torch

    method, ids, logits, clock = None, prompt, [], [time.time()]
    for _ in range(tokens):
        method = method or make()
        last = method(input_ids=ids, use_cache=False).logits[:, -1]
        logits.append(last.clone())  # a replay's outputs are rewritten by the next replay
        ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=1)
        clock.append(time.time())
    return ids, logits, clock


def run_decode(
    make: Any, model: Any, prompt: Any, steps: int, cache_len: int
) -> tuple[Any, list[Any], list[float]]:
    """An eager prefill of ``prompt`` into a fresh ``StaticCache``, then ``steps`` greedy steps."""
    import torch
    from transformers import StaticCache

    from npugraph_ex.bench.decode import cache_keyword

    keyword = cache_keyword(model)
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    state = {"use_cache": True, keyword: cache}
    prefill = model(input_ids=prompt, cache_position=torch.arange(prompt.shape[1]), **state)
    logits = [prefill.logits[:, -1]]
    ids, method, clock = [logits[0].argmax(-1, keepdim=True)], None, [time.time()]
    for step in range(steps):
        method = method or make()
        pos = torch.tensor([prompt.shape[1] + step])
        out = method(input_ids=ids[-1], cache_position=pos, **state)
        logits.append(out.logits[:, -1].clone())
        ids.append(logits[-1].argmax(-1, keepdim=True))
        clock.append(time.time())
    return torch.cat(ids, dim=1), logits, clock


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this fresh process: imports, build, first call, the rest, the checks."""
    import torch
    import transformers  # noqa: F401 - imported up front, charged to the imports
    from torch._dynamo.utils import counters

    import npugraph_ex.inference
    from npugraph_ex.bench.growing import prompt_ids
    from npugraph_ex.bench.presets import build_qwen3

    imported = time.time()
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    mode, root, growing = spec["mode"], Path(spec["root"]), spec["workload"] == "growing"
    options = {"capture_limit": spec["tokens"]} if growing else {}
    with torch.no_grad():
        model = build_qwen3(spec["model"], seed=spec["seed"])
        prompt = prompt_ids(model.config.vocab_size, PROMPT_TOKENS, spec["seed"], "cpu")
        built = time.time()
        held: list[Any] = []

        def make() -> Any:
            held.append(compiled(mode, model, growing, options, root))
            return held[-1]

        def run(fn: Any) -> tuple[Any, list[Any], list[float]]:
            if growing:
                return run_growing(fn, prompt, spec["tokens"])
            return run_decode(fn, model, prompt, spec["steps"], spec["max_cache_len"])

        ids, logits, clock = run(make)
        graphs = counters["stats"]["unique_graphs"]
        reference = run(lambda: model.forward) if mode != "eager" else (ids, logits, clock)
    if mode == "inductor-cold":
        (root / ARTIFACTS).write_bytes(torch.compiler.save_cache_artifacts()[0])
    diffs = [float((a - b).abs().max()) for a, b in zip(logits, reference[1], strict=True)]
    equal = torch.equal(ids, reference[0]) and all(
        torch.equal(a, b) for a, b in zip(logits, reference[1], strict=True)
    )
    info = held[0].cache_info() if mode in CACHED else {}
    hits = counters["inductor"]["fxgraph_cache_hit"], counters["aot_autograd"]["autograd_cache_hit"]
    cache = f"{info['hits']} hits, {info['compiled']} compiled" if info else "-"
    if mode.startswith("inductor"):
        cache = "fx {} hit, aot {} hit".format(*hits)
    return {
        "workload": spec["workload"],
        "mode": mode,
        "start_s": STARTED - spec["spawned"],
        "imports_s": imported - STARTED,
        "build_s": built - imported,
        "first_call_s": clock[1] - clock[0],
        "captures_s": sum(g["capture_seconds"] for g in npugraph_ex.stats()["graphs"]),
        "start_to_first_s": clock[1] - spec["spawned"],
        "start_to_end_s": clock[-1] - spec["spawned"],
        "dynamo_graphs": graphs,
        "cache": cache,
        "cache_info": {k: v for k, v in info.items() if k != "path"},
        "tokens_equal_eager": torch.equal(ids, reference[0]),
        "equal_eager": equal,
        "max_abs_diff": max(diffs),
        "digest": hashlib.sha256(b"".join(t.numpy().tobytes() for t in logits)).hexdigest()[:16],
    }


def spawn(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(spec["root"]) / "inductor"))
    command = [sys.executable, __file__, "--child", json.dumps(spec | {"spawned": time.time()})]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{spec['workload']} {spec['mode']} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    what = "LOGITS" if result["tokens_equal_eager"] else "TOKENS"
    loud = "" if result["equal_eager"] else f"  !!! {what} DIFFER FROM EAGER !!!"
    print(
        f"  {spec['workload']:8} {spec['mode']:17} first call {result['first_call_s']:7.2f} s, "
        f"start -> first {result['start_to_first_s']:7.2f} s{loud}",
        flush=True,
    )
    return result


def measure(args: argparse.Namespace, modes: list[str], scratch: Path) -> list[dict[str, Any]]:
    """Every repeat: the units in order (reversed on odd repeats), each in fresh processes."""
    base = {k: v for k, v in vars(args).items() if k in CHILD_SETTINGS}
    results = []
    for repeat in range(args.repeats):
        print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
        units = UNITS[::-1] if repeat % 2 else UNITS
        for workload in args.workloads.split(","):
            for unit in units:
                root = Path(tempfile.mkdtemp(dir=scratch))
                for mode in (m for m in unit if m in modes):
                    spec = base | {"workload": workload, "mode": mode, "root": str(root)}
                    results.append(spawn(spec) | {"repeat": repeat})
    return results


def summarise(results: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per workload and mode: the median of each time, the counts and checks of every repeat."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["workload"], r["mode"]), []).append(r)
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    summary = {}
    for key in sorted(groups, key=lambda k: (workloads.index(k[0]), MODES.index(k[1]))):
        rows = groups[key]
        times = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k.endswith("_s")}
        counts = sorted({r["dynamo_graphs"] for r in rows})
        hits = sorted({r["cache"] for r in rows})
        summary[key] = times | {
            "dynamo_graphs": "/".join(map(str, counts)),
            "cache": " / ".join(hits),
            "equal_eager": all(r["equal_eager"] for r in rows),
            "tokens_equal_eager": all(r["tokens_equal_eager"] for r in rows),
            "max_abs_diff": max(r["max_abs_diff"] for r in rows),
            "digests": sorted({r["digest"] for r in rows}),
            "first_call_per_repeat_s": [r["first_call_s"] for r in rows],
        }
    return summary


def report(summary: dict[tuple[str, str], dict[str, Any]], args: argparse.Namespace) -> None:
    from common import format_table

    header = ["workload", "mode", *(title for title, _ in COLUMNS), "= eager"]
    rows = []
    for (workload, mode), s in summary.items():
        same = "yes" if s["equal_eager"] else "tokens" if s["tokens_equal_eager"] else "NO"
        same += "" if s["equal_eager"] else f" ({s['max_abs_diff']:.1e})"
        rows.append([workload, mode, *(s[key] for _, key in COLUMNS), same])
    print(format_table(header, rows))
    for workload in args.workloads.split(","):
        get = {m: summary.get((workload, m)) for m in MODES}
        cold, warm, peer = get["npugraph_ex-cold"], get["npugraph_ex-warm"], get["inductor-warm"]
        if cold and warm:
            share = warm["first_call_s"] / cold["first_call_s"]
            same = "identical" if len(set(cold["digests"] + warm["digests"])) == 1 else "DIFFER"
            print(
                f"{workload}: warm first call {share:.1%} of cold (target < 10%: "
                f"{'met' if share < 0.1 else 'not met'}); warm and cold logits {same}"
            )
        if warm and peer:
            for field in ("first_call_s", "start_to_first_s"):
                ratio = peer[field] / warm[field]
                print(f"{workload}: {field} inductor-warm / npugraph_ex-warm = {ratio:.2f}x")


def plot(summary: dict[tuple[str, str], dict[str, Any]], args: argparse.Namespace) -> None:
    from common import PALETTE, Panel, bar_panels

    colours = dict(zip(("npugraph_ex-cold", "eager", *MODES[2:]), PALETTE[1:], strict=False))
    colours["eager"] = PALETTE[0]
    panels = []
    for workload in args.workloads.split(","):
        order = ["npugraph_ex-cold", *(m for m in MODES if m != "npugraph_ex-cold")]
        times = {
            m: summary[(workload, m)]["first_call_per_repeat_s"]
            for m in order
            if (workload, m) in summary
        }
        what = "first token" if workload == "growing" else "first decode step"
        panels.append(Panel(f"{workload} ({what}), {args.model}", times, colours))
    title = "First call in a fresh process (x = speed-up over npugraph_ex-cold)"
    bar_panels(panels, args.plot, title=title, unit="s", ylabel="seconds (median)")


def main() -> None:
    from common import add_common_args

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (default), micro or qwen3-0.6b")
    parser.add_argument("--workloads", default="growing,decode")
    parser.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated, of {', '.join(MODES)} (default: all for tiny, "
        "no inductor modes for other models)",
    )
    parser.add_argument("--tokens", type=int, default=16, help="growing: lengths (default 16)")
    parser.add_argument("--steps", type=int, default=8, help="decode: steps (default 8)")
    parser.add_argument("--max-cache-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, help="write the first-call chart (PNG) here")
    add_common_args(parser, NAME, repeats=3)
    args = parser.parse_args()
    default = MODES if args.model == "tiny" else [m for m in MODES if "inductor" not in m]
    modes = args.modes.split(",") if args.modes else list(default)
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}; valid: {', '.join(MODES)}")
    with tempfile.TemporaryDirectory(prefix="warm_start_") as scratch:
        results = measure(args, modes, Path(scratch))
    from common import print_heading, settings_of, write_json

    summary = summarise(results)
    print_heading(f"model {args.model}, median of {args.repeats}")
    report(summary, args)
    medians = {f"{w}/{m}": s for (w, m), s in summary.items()}
    write_json(args.out, NAME, settings_of(args), {"medians": medians, "runs": results})
    if args.plot:
        plot(summary, args)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        main()
