"""The markdown table of OpInfo sweep runs (``opinfo_sweep.py``) and the JSON they are kept in."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Any

import torch
from opinfo_sweep import CLASSES, DTYPES, EQUAL, NO_GRAPH


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


UNSAID = {NO_GRAPH: "Dynamo handed no graph to the backend (graph break, data-dependent op)"}
"""What the table says for a class whose results carry no reason."""


def short_reason(reason: str) -> str:
    """A reason without what every fallback message repeats: the graph's name and the source
    line (the sweep's own call of the op)."""
    reason = re.sub(r"npugraph_ex: graph\[[^\]]*\] runs eagerly, not captured: ", "", reason)
    return reason.split(" at File ")[0]


def run_title(run: dict[str, Any]) -> str:
    title = f"{run['dtype']}, {'dynamic=True' if run['dynamic'] else 'static shapes'}"
    return f"{title}, {run['options']}" if run.get("options") else title


def run_kind(run: dict[str, Any]) -> tuple[str, bool, str]:
    """Runs of one kind replace each other in the JSON: dtype, dynamic and the options given."""
    return run["dtype"], run["dynamic"], run.get("options", "")


def render_run(run: dict[str, Any]) -> list[str]:
    results = run["results"]
    counts = Counter(r["cls"] for r in results)
    lines = [f"## {run_title(run)}", ""]
    if run.get("ops", "all") != "all":
        lines += [f"OpInfos selected by `--ops {run['ops']}`.", ""]
    lines.append(
        f"{len(results)} OpInfo variants ({', '.join(run['variants'])}), "
        f"up to {run['limit_samples']} samples each, "
        f"{run['seconds'] / 60:.1f} min ({run['threads']} intra-op thread, {run['cores']} cores). "
        "Samples: " + ", ".join(f"{c} {n}" for c, n in sorted(run["sample_counts"].items())) + "."
    )
    if run.get("options"):
        kernels = sum(r.get("kernels", 0) for r in results)
        captures = sum(r["captures"] for r in results)
        lines += ["", f"Keys on compiled kernels: {kernels} of {captures} captured."]
    if "environment" in run:
        commits = ", then ".join(run["commits"])
        lines += ["", f"{run['environment']}; npugraph_ex commit {commits}."]
    lines += ["", "| class | ops |", "|---|---|"]
    lines += [f"| {c} | {counts[c]} |" for c in CLASSES if counts[c]]
    others = sorted(
        (r for r in results if r["cls"] != EQUAL),
        key=lambda r: (CLASSES.index(r["cls"]), r["name"]),
    )
    if others:
        lines += ["", "| op | class | samples | reason |", "|---|---|---|---|"]
        for r in others:
            samples = ", ".join(f"{c} {n}" for c, n in sorted(r["samples"].items()))
            reason = cell(short_reason(r["reason"]) or UNSAID.get(r["cls"], ""))
            lines.append(f"| `{r['name']}` | {r['cls']} | {samples} | {reason} |")
    inexact = sorted((r for r in results if r.get("inexact")), key=lambda r: r["name"])
    if inexact and "static_kernel_compile=True" in run.get("options", ""):
        lines += [
            "",
            f"{len(inexact)} within tolerance, but not bit-identical to `aot_eager`: "
            "Inductor's kernels fuse and reorder.",
        ]
    elif inexact:
        lines += ["", "Within tolerance, but not bit-identical to `aot_eager`:", ""]
        lines += ["| op | class | first difference |", "|---|---|---|"]
        lines += [f"| `{r['name']}` | {r['cls']} | {cell(r['inexact'])} |" for r in inexact]
    return [*lines, ""]


def render(runs: list[dict[str, Any]]) -> str:
    head = [
        "# OpInfo sweep",
        "",
        "PyTorch's OpInfo database (`torch.testing._internal.common_methods_invocations.op_db`) "
        'run through `backend="npugraph_ex"` with default options (where a run\'s title names '
        "options, with those), each sample called three "
        "times (the capture, then two replays on fresh inputs of the same structure) and compared "
        'with `backend="aot_eager"` on the same inputs. Written by `make sweep` '
        "(`tests/sweep/opinfo_sweep.py`; the classes are defined in its docstring). "
        f"torch {torch.__version__}.",
        "",
    ]
    body = [line for run in runs for line in render_run(run)]
    return "\n".join(head + body)


def merge_runs(path: str, run: dict[str, Any], *, update: bool) -> list[dict[str, Any]]:
    """The runs already in the JSON at ``path``, with ``run`` replacing the one of the same kind
    (``run_kind``); with ``update``, only that run's results of the ops ``run`` has."""
    runs = []
    if os.path.exists(path):
        with open(path) as existing:
            runs = json.load(existing)["runs"]
    same = run_kind(run)
    old = next((r for r in runs if run_kind(r) == same), None)
    if update and old is not None:
        rerun = {r["name"] for r in run["results"]}
        kept = [r for r in old["results"] if r["name"] not in rerun]
        replaced = sum(r["seconds"] for r in old["results"] if r["name"] in rerun)
        seconds = round(old["seconds"] - replaced + run["seconds"], 1)
        commits = [*old.get("commits", ["unknown"]), *run["commits"]]
        variants = [*old["variants"], *(v for v in run["variants"] if v not in old["variants"])]
        run = {**old, "results": kept + run["results"], "seconds": seconds, "commits": commits}
        run["variants"] = variants
        run["environment"] = old.get("environment", run["environment"])
        run["sample_counts"] = sample_counts(run["results"])
    runs = [r for r in runs if run_kind(r) != same] + [run]
    order = {name: index for index, name in enumerate(DTYPES)}
    return sorted(runs, key=lambda r: (order[r["dtype"]], *run_kind(r)[1:]))


def sample_counts(results: list[dict[str, Any]]) -> dict[str, int]:
    return dict(sum((Counter(r["samples"]) for r in results), Counter()))
