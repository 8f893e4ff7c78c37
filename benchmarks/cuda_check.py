"""The GPU check in one run of at most 8 minutes: the CUDA tests, then the bench in half precision.

A GPU may be at hand for a few minutes only, so everything that needs one runs from this one
command, each step in its own process group under its own time limit, the whole under
``--budget-s`` (a step may also use what the steps before it left unused, as long as every later
step keeps its own limit; one left with less than three quarters of its limit is skipped):

    1. the ``cuda``-marked tests (over ``pytest-xdist`` where it is installed; each test under
       ``pytest-timeout`` where that is installed)
    2. ``held_outputs.py``: a replay's host time on a micro function, outputs dropped or held
    3. the bench on the tiny model in float16: decode and one token, beside static kernels,
       ``reduce-overhead`` and ``inductor``
    4. the bench on Qwen3-0.6B (random weights) in bfloat16: decode beside ``reduce-overhead``
    5. the tiny model in bfloat16 (decode and one token, background kernels among the variants)
       and its growing loop (8 lengths) in float16, then the 0.6B decode in float16
    6. ``growing_peak.py``: where the growing loop's peak memory comes from, backend by backend

each bench with its physical limit: the model's weight bytes over the device's measured copy
bandwidth, per token. The limits follow the first H200 runs (docs/notes): ``reduce-overhead``
took 52 s to capture the tiny growing loop's 32 lengths and 131 s for the 0.6B loop's 16, so the
0.6B model runs decode only, and Inductor and static kernels the tiny model only. Each bench
prints its tables at its end: a step stopped by its limit has none. A step that runs out of time
or fails is recorded with its output's tail, and the next one runs. Everything goes to
``--out-dir``: each step's whole output (``<step>.log``), each bench's JSON record, the tests'
JUnit XML (``cuda-tests.xml``), ``cuda_check.json`` (device, driver, versions, copy bandwidth,
each step's status, seconds and tables) and ``cuda_check.md``, the section ``--apply`` puts into
docs/benchmarks.md (between its ``cuda-check`` markers).

    python benchmarks/cuda_check.py --out-dir "$OUT"        # on the GPU machine (make cuda-check)
    python benchmarks/cuda_check.py --dry-run               # the same steps on CPU, small
    python benchmarks/cuda_check.py --apply DIR             # the section of DIR into the docs
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- cuda-check -->", "<!-- /cuda-check -->"
VARIANTS = (
    "eager,npugraph_ex,npugraph_ex+static_kernels,npugraph_ex+background,reduce-overhead,inductor"
)
TINY_VARIANTS = "eager,npugraph_ex,npugraph_ex+static_kernels,reduce-overhead,inductor"
"""The tiny model's peers on the GPU (``npugraph_ex+background`` runs in its bfloat16 step)."""

NOTES = ("npugraph_ex+background:", "GPU time of one replay", "at the peak, ")
"""Lines after a table that belong to it."""

PYTEST_SUMMARY = re.compile(r"=+ .*\bin [\d.]+s\b.* =+$")
"""pytest's last line: ``==== 3 failed, 58 passed, 2043 deselected in 80.12s (0:01:20) ====``."""


@dataclass
class Step:
    name: str
    command: list[str]
    limit_s: int
    status: str = "not run"
    seconds: float = 0.0
    tables: list[str] = field(default_factory=list)
    tail: str = ""
    log: str = ""
    """The file (in the output folder) holding the step's whole output."""


def bench(name: str, out_dir: Path, limit_s: int, *flags: str) -> Step:
    record = out_dir / f"{name}.json"
    command = [sys.executable, "-m", "npugraph_ex.cli", "bench", "--no-plot", "--out", str(record)]
    return Step(name, command + list(flags), limit_s)


def test_command(out_dir: Path) -> list[str]:
    """pytest on the ``cuda``-marked tests, each test's result on a line of its own (a step
    stopped by its limit still shows which passed), their JUnit XML in ``out_dir``; over
    ``pytest-xdist`` where it is installed. A test stuck waiting (a kernel tier that never
    settles) is failed by ``pytest-timeout`` where it is installed, before the step's limit."""
    tests = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "cuda"]
    tests += ["--durations=20", f"--junitxml={out_dir / 'cuda-tests.xml'}", str(ROOT / "tests")]
    if importlib.util.find_spec("xdist") is not None:  # 8 workers: 50 tests in 44 s on an H200
        tests += ["-n", str(max(2, min(8, (os.cpu_count() or 4) // 2)))]
    if importlib.util.find_spec("pytest_timeout") is not None:
        tests += ["--timeout=120"]
    return tests


def steps(out_dir: Path, dry_run: bool) -> list[Step]:
    tests = test_command(out_dir)
    held = [sys.executable, str(ROOT / "benchmarks" / "held_outputs.py")]
    held += ["--out", str(out_dir / "held_outputs.json")]
    peak = [sys.executable, str(ROOT / "benchmarks" / "growing_peak.py")]
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
    cuda = ["--device", "cuda"]
    tiny = [*cuda, "--model", "tiny", "--repeats", "3"]
    qwen3 = [*cuda, "--model", "qwen3-0.6b", "--workloads", "decode", "--repeats", "3"]
    qwen3 += ["--steps", "32", "--variants", "eager,npugraph_ex,reduce-overhead"]
    # 480 s in all; time a step leaves unused goes to the next ones (``run_all``).
    return [
        Step("cuda tests", tests, 145),
        Step("held outputs", [*held, *cuda], 25),
        bench("tiny-float16", out_dir, 55, *tiny, "--dtype", "float16",
              "--workloads", "decode,token", "--variants", TINY_VARIANTS),
        bench("qwen3-0.6b-decode-bfloat16", out_dir, 60, *qwen3, "--dtype", "bfloat16"),
        bench("tiny-bfloat16", out_dir, 55, *tiny, "--dtype", "bfloat16",
              "--workloads", "decode,token",
              "--variants", "eager,npugraph_ex,npugraph_ex+background,reduce-overhead"),
        bench("tiny-growing-float16", out_dir, 45, *tiny, "--dtype", "float16",
              "--workloads", "growing", "--tokens", "8",
              "--variants", "eager,npugraph_ex,reduce-overhead"),
        bench("qwen3-0.6b-decode-float16", out_dir, 60, *qwen3, "--dtype", "float16"),
        Step("growing peak", [*peak, *cuda], 35),
    ]  # fmt: skip


def log_name(step: Step) -> str:
    """A file name for the step's output: letters, digits, dots and dashes only."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", step.name).strip("-") + ".log"


def execute(command: list[str], limit_s: float) -> tuple[str, int | None]:
    """Run ``command`` in a process group of its own; (its output, stdout and stderr
    interleaved, and its exit code, or None where it ran past ``limit_s``). Past the limit
    the whole group is killed: workers it started (pytest-xdist's, a background compile's)
    must not hold the GPU or its memory during the next step."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # what a killed step printed is kept
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=limit_s)
        return output, process.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a process that left the group holds the pipe
            process.kill()
            output = ""
        return output, None


def run_all(planned: list[Step], budget_s: float, out_dir: Path) -> None:
    """Run the steps in order within ``budget_s``: each may also use the time the steps
    before it left unused, as long as every later step keeps its own limit."""
    started = time.monotonic()
    for index, step in enumerate(planned):
        remaining = budget_s - (time.monotonic() - started)
        later = sum(s.limit_s for s in planned[index + 1 :])
        run(step, max(remaining - later, min(step.limit_s, remaining)), out_dir)
        print(f"{step.name}: {step.status} in {step.seconds} s", flush=True)


def run(step: Step, limit_s: float, out_dir: Path) -> None:
    if limit_s < 0.75 * step.limit_s:
        step.status = f"skipped: {limit_s:.0f} s left of the budget, limit {step.limit_s} s"
        return
    started = time.monotonic()
    output, code = execute(step.command, limit_s)
    if code is None:
        step.status = f"stopped after {limit_s:.0f} s"
    else:
        step.status = "passed" if code == 0 else f"failed (exit {code})"
    step.seconds = round(time.monotonic() - started, 1)
    step.tables = tables_in(output)
    step.tail = output[-3000:]
    step.log = log_name(step)
    (out_dir / step.log).write_text(output)


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
    summary = [line for line in lines if PYTEST_SUMMARY.match(line)]
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
    out_dir = args.out_dir.resolve()  # the steps run in the repository's root
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    planned = steps(out_dir, args.dry_run)
    run_all(planned, args.budget_s, out_dir)
    about = machine()
    record = {
        "commit": commit(),
        "machine": about,
        "seconds": time.monotonic() - started,
        "steps": [asdict(step) for step in planned],
    }
    for step in record["steps"]:
        record_path = out_dir / f"{step['name']}.json"
        step["limit"] = weight_floor(record_path, about.get("copy_bytes_per_s"))
    (out_dir / "cuda_check.json").write_text(json.dumps(record, indent=1))
    (out_dir / "cuda_check.md").write_text(section(record) + "\n")
    print(f"wrote {out_dir / 'cuda_check.json'} and cuda_check.md")


if __name__ == "__main__":
    main()
