"""The GPU check in one run of at most 8 minutes: the CUDA tests, then the bench in half precision.

A GPU may be at hand for a few minutes only, so everything that needs one runs from this one
command, each step in its own process under its own time limit, the whole under ``--budget-s``:

    1. the ``cuda``-marked tests (over ``pytest-xdist`` where it is installed)
    2. ``held_outputs.py``: a replay's host time on a micro function, outputs dropped or held
    3. the bench on the tiny model, float16 and bfloat16: decode, one token, growing loop
    4. the bench on Qwen3-0.6B (random weights): decode in float16 and bfloat16, the growing loop
       (16 lengths) in float16
    5. ``growing_peak.py``: where the growing loop's peak memory comes from, backend by backend

beside ``reduce-overhead`` and ``inductor`` (not on the 0.6B growing loop: Inductor takes minutes
to compile it), each bench with its physical limit: the model's weight bytes over the device's
measured copy bandwidth, per token. Each bench prints its tables at its end: a step stopped by
its limit has none. A step that runs out of time or fails is recorded with its output's tail,
and the next one runs; a step that no longer fits the budget is skipped. Everything goes to
``--out-dir``: each bench's JSON record, ``cuda_check.json`` (device, driver, versions, copy
bandwidth, each step's status, seconds and tables) and ``cuda_check.md``, the section ``--apply``
puts into docs/benchmarks.md (between its ``cuda-check`` markers).

    python benchmarks/cuda_check.py --out-dir "$OUT"        # on the GPU machine (make cuda-check)
    python benchmarks/cuda_check.py --dry-run               # the same steps on CPU, small
    python benchmarks/cuda_check.py --apply DIR             # the section of DIR into the docs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- cuda-check -->", "<!-- /cuda-check -->"
VARIANTS = (
    "eager,npugraph_ex,npugraph_ex+static_kernels,npugraph_ex+background,reduce-overhead,inductor"
)

NOTES = ("npugraph_ex+background:", "GPU time of one replay", "at the peak, ")
"""Lines after a table that belong to it."""


@dataclass
class Step:
    name: str
    command: list[str]
    limit_s: int
    status: str = "not run"
    seconds: float = 0.0
    tables: list[str] = field(default_factory=list)
    tail: str = ""


def bench(name: str, out_dir: Path, limit_s: int, *flags: str) -> Step:
    record = out_dir / f"{name}.json"
    command = [sys.executable, "-m", "npugraph_ex.cli", "bench", "--no-plot", "--out", str(record)]
    return Step(name, command + list(flags), limit_s)


def steps(out_dir: Path, dry_run: bool) -> list[Step]:
    tests = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests"]
    if importlib.util.find_spec("xdist") is not None:
        tests += ["-n", "4"]
    held = [sys.executable, str(Path(__file__).with_name("held_outputs.py"))]
    held += ["--out", str(out_dir / "held_outputs.json")]
    peak = [sys.executable, str(Path(__file__).with_name("growing_peak.py"))]
    peak += ["--out", str(out_dir / "growing_peak.json")]
    if dry_run:  # the same steps on CPU, on a model small enough for a minute
        common = ["--device", "cpu", "--repeats", "2", "--steps", "8", "--tokens", "4"]
        variants = ["--variants", VARIANTS.replace("reduce-overhead,", "")]
        return [
            Step("cuda tests", tests, 120),
            Step("held outputs", [*held, "--device", "cpu", "--calls", "200"], 30),
            Step("growing peak", [*peak, "--device", "cpu", "--tokens", "4"], 60),
            *(bench(f"micro-{dtype}", out_dir, 120, "--model", "micro", "--dtype", dtype,
                    "--workloads", "decode,token,growing", *variants, *common)
              for dtype in ("float16", "bfloat16")),
        ]  # fmt: skip
    return [
        Step("cuda tests", tests, 85),
        Step("held outputs", held + ["--device", "cuda"], 30),
        *(bench(f"tiny-{dtype}", out_dir, 65, "--device", "cuda", "--model", "tiny",
                "--dtype", dtype, "--workloads", "decode,token,growing", "--variants", VARIANTS,
                "--repeats", "5", "--tokens", "16")
          for dtype in ("float16", "bfloat16")),
        *(bench(f"qwen3-0.6b-decode-{dtype}", out_dir, 65, "--device", "cuda",
                "--model", "qwen3-0.6b", "--dtype", dtype, "--workloads", "decode",
                "--variants", VARIANTS, "--repeats", "3")
          for dtype in ("float16", "bfloat16")),
        bench("qwen3-0.6b-growing-float16", out_dir, 65, "--device", "cuda",
              "--model", "qwen3-0.6b", "--dtype", "float16", "--workloads", "growing",
              "--variants", "eager,npugraph_ex,npugraph_ex+background,reduce-overhead",
              "--repeats", "3", "--tokens", "16"),
        Step("growing peak", [*peak, "--device", "cuda"], 40),
    ]  # fmt: skip


def run(step: Step, remaining_s: float) -> None:
    limit = min(step.limit_s, remaining_s)
    if limit < 20:
        step.status = "skipped: out of time"
        return
    started = time.monotonic()
    try:
        done = subprocess.run(step.command, capture_output=True, text=True, timeout=limit)
        output = done.stdout + done.stderr
        step.status = "passed" if done.returncode == 0 else f"failed (exit {done.returncode})"
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode() + (expired.stderr or b"").decode()
        step.status = f"stopped after {limit:.0f} s"
    step.seconds = round(time.monotonic() - started, 1)
    step.tables = tables_in(output)
    step.tail = output[-3000:]


def tables_in(output: str) -> list[str]:
    """The Markdown tables a bench printed, each with the caption line above it and the notes
    lines after it; the last line of pytest's summary for the tests."""
    blocks, lines = [], output.splitlines()
    for i, line in enumerate(lines):
        starts = line.startswith("| variant") and (i == 0 or not lines[i - 1].startswith("|"))
        if not starts:
            continue
        end = i
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        caption = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        notes = [n for n in lines[end : end + 16] if n.startswith(NOTES)]
        blocks.append("\n".join([caption, "", *lines[i:end], *([""] + notes if notes else [])]))
    summary = [line for line in lines if " passed" in line or " failed" in line]
    return blocks or summary[-1:]


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
        info["copy_bytes_per_s"] = copy_bandwidth()
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            info["driver"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
        except OSError:
            info["driver"] = "unknown"
    else:
        info["device"] = "cpu (dry run)"
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def copy_bandwidth(nbytes: int = 1 << 30, copies: int = 10) -> float:
    """Bytes per second a device-to-device copy moves (each copy reads and writes ``nbytes``):
    the memory bandwidth a decode step that reads every weight once can use at most."""
    import torch

    source = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    target.copy_(source)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(copies):
        target.copy_(source)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    del source, target
    torch.cuda.empty_cache()
    return 2 * nbytes * copies / seconds


def weight_floor(record_path: Path, bytes_per_s: float | None) -> str | None:
    """The physical limit beside a bench's figures: its model's weight bytes over the measured
    copy bandwidth, per token (a decode step reads every weight once)."""
    if bytes_per_s is None or not record_path.exists():
        return None
    model = json.loads(record_path.read_text()).get("model") or {}
    if "parameters" not in model or "dtype" not in model:
        return None
    element = {"float32": 4, "float16": 2, "bfloat16": 2}.get(model["dtype"], 4)
    weights = model["parameters"] * element
    seconds = weights / bytes_per_s
    return (
        f"Physical limit: {weights / 1e9:.3f} GB of {model['dtype']} weights over "
        f"{bytes_per_s / 1e12:.2f} TB/s (measured device copy) = {seconds * 1e3:.3f} ms per "
        f"token, at most {1 / seconds:,.0f} tokens/s."
    )


def section(record: dict[str, Any]) -> str:
    about = record["machine"]
    lines = [
        BEGIN,
        "",
        f"`make cuda-check` ({record['commit']}): {about['device']}, driver "
        f"{about.get('driver', '-')}, CUDA {about.get('cuda', '-')}, torch {about['torch']}, "
        f"transformers {about.get('transformers', '-')}, Python {about['python']}; "
        f"{record['seconds']:.0f} s in all.",
        "",
    ]
    for step in record["steps"]:
        lines += [f"**{step['name']}**: {step['status']} in {step['seconds']} s", ""]
        for table in step["tables"]:
            lines += [table, ""]
        if step.get("limit"):
            lines += [step["limit"], ""]
    return "\n".join(lines + [END])


def apply(folder: Path) -> None:
    text = (folder / "cuda_check.md").read_text()
    docs = DOCS.read_text()
    if BEGIN in docs:
        docs = docs[: docs.index(BEGIN)] + text + docs[docs.index(END) + len(END) :]
    else:
        docs = docs.replace(
            "## CUDA: NVIDIA H200", f"## CUDA check\n\n{text}\n\n## CUDA: NVIDIA H200"
        )
    DOCS.write_text(docs)
    print(f"wrote the section of {folder} into {DOCS}")


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"commit `{done.stdout.strip()}`" if done.returncode == 0 else "no git commit"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("bench-results/cuda-check"))
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--dry-run", action="store_true", help="the same steps on CPU, small")
    parser.add_argument("--apply", type=Path, help="put DIR/cuda_check.md into the docs")
    args = parser.parse_args()
    if args.apply is not None:
        apply(args.apply)
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    planned = steps(args.out_dir, args.dry_run)
    for step in planned:
        run(step, args.budget_s - (time.monotonic() - started))
        print(f"{step.name}: {step.status} in {step.seconds} s", flush=True)
    about = machine()
    record = {
        "commit": commit(),
        "machine": about,
        "seconds": time.monotonic() - started,
        "steps": [asdict(step) for step in planned],
    }
    for step in record["steps"]:
        record_path = args.out_dir / f"{step['name']}.json"
        step["limit"] = weight_floor(record_path, about.get("copy_bytes_per_s"))
    (args.out_dir / "cuda_check.json").write_text(json.dumps(record, indent=1))
    (args.out_dir / "cuda_check.md").write_text(section(record) + "\n")
    print(f"wrote {args.out_dir / 'cuda_check.json'} and cuda_check.md")


if __name__ == "__main__":
    main()
