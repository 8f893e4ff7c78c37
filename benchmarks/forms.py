"""Workloads timed in every form a graph could take, for the scripts that ask what a kind of
graph that used to run eagerly costs now (``random_ops.py``, ``control_flow.py``).

Forms: eager; the graph run eagerly (``force_eager=True``: what such a graph got before the CPU
replay captured it); the ATen replay (``static_kernel_compile=False``); the defaults (the kernel
tier, settled on kernels or ATen); plain Inductor. A workload is a function returning
``(call_of, fn)``: ``fn`` is what is compiled, ``call_of(f)`` a call of ``f`` on the workload's
inputs. Each form's call is checked against a call of eager of its own under three seeds before
timing, by the script's ``check(form, got, expected)``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import (
    add_common_args,
    add_settling_args,
    apply_threads,
    format_table,
    live_graph_numbers,
    managers_since,
    median,
    print_heading,
    settings_of,
    settled_times,
    spread,
    write_json,
)

FORMS: dict[str, dict[str, Any] | None] = {
    "graph run eagerly": {"force_eager": True},
    "ATen replay": {"static_kernel_compile": False},
    "default": {},
    "inductor": None,
}
"""Each form's options for ``backend="npugraph_ex"``; None: ``backend="inductor"``."""

Workload = Callable[[], tuple[Callable[[Callable[..., Any]], Callable[[], Any]], Callable]]
Check = Callable[[str, Any, Any], None]


def compiled(fn: Callable[..., Any], options: dict[str, Any] | None) -> Callable[..., Any]:
    if options is None:
        return torch.compile(fn, backend="inductor", fullgraph=True)
    return torch.compile(fn, backend="npugraph_ex", fullgraph=True, options=options or None)


def checked_calls(
    workload: Workload, forms: list[str], check: Check
) -> dict[str, tuple[Callable[[], Any], list]]:
    """Eager's call and each of ``forms``' calls, each compiled one checked against a call of
    eager of its own under three seeds; the capture managers each form made."""
    call_of, fn = workload()
    calls = {"eager": (call_of(fn), [])}
    for name in forms:
        before = live_graph_numbers()
        call, reference = call_of(compiled(fn, FORMS[name])), call_of(fn)
        for seed in range(3):
            torch.manual_seed(seed)
            got = call()
            torch.manual_seed(seed)
            check(name, got, reference())
        calls[name] = (call, managers_since(before))
    return calls


def in_fresh_process(
    script: str, args: argparse.Namespace, workload: str, form: str
) -> dict[str, list]:
    """One workload and form of ``script`` timed against eager in a fresh process with a fresh
    Inductor cache folder; the eager row named for the form's process."""
    with tempfile.TemporaryDirectory(prefix="npugraph_ex_forms_") as folder:
        out = Path(folder) / "record.json"
        command = [sys.executable, script, "--workloads", workload, "--forms", form]
        command += ["--out", str(out), "--calls", str(args.calls), "--repeats", str(args.repeats)]
        command += ["--warmup-calls", str(args.warmup_calls), "--settle-s", str(args.settle_s)]
        command += ["--threads", str(args.threads)] if args.threads else []
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(folder) / "inductor")}
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        times = json.loads(out.read_text())["results"]["times"][workload]
    return {f"eager ({form}'s process)": times["eager"], form: times[form]}


def main(script: str, workloads: dict[str, Workload], check: Check, what: str) -> None:
    """The command line of ``script``: its ``workloads`` in every form, in one process or
    (``--per-process``) each form in a fresh one; ``what`` titles the table."""
    name = Path(script).stem
    doc = sys.modules["__main__"].__doc__ or name
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_settling_args(parser)
    parser.add_argument("--workloads", default=",".join(workloads))
    parser.add_argument("--forms", default=",".join(FORMS), help="compiled forms, in one process")
    parser.add_argument(
        "--per-process",
        action="store_true",
        help="each workload and form in a fresh process and Inductor cache, against eager",
    )
    add_common_args(parser, name, repeats=7)
    args = parser.parse_args()
    apply_threads(args.threads)
    results: dict[str, Any] = {}
    rows = []
    with torch.no_grad():
        for workload in args.workloads.split(","):
            if args.per_process:
                times: dict[str, list] = {}
                for form in args.forms.split(","):
                    times.update(in_fresh_process(script, args, workload, form))
            else:
                calls = checked_calls(workloads[workload], args.forms.split(","), check)
                times = settled_times(calls, args, workload)
            results[workload] = times
            for form, t in times.items():
                # Against eager of the same process (a fresh process per form: its own eager).
                eager = times.get(f"eager ({form}'s process)") or times.get("eager") or t
                rows.append([workload, form, median(t) * 1e3, spread(t), median(eager) / median(t)])
    where = "each form in a fresh process and Inductor cache" if args.per_process else "one process"
    print_heading(f"{what} ({where}): ms per call (median), speed-up over eager")
    print(format_table(["workload", "form", "ms per call", "spread", "x eager"], rows))
    write_json(args.out, name, settings_of(args), {"times": results})
