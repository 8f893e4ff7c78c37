"""How fast does ``npugraph_ex.tools.bisect`` find a wrong rewrite, and does PyTorch's accuracy
minifier find it at all?

The bug: a user pattern registered with ``npugraph_ex.register_replacement`` that is subtly
wrong (its replacement is off by 0.1%). Two cases:

- ``toy``: ``(sinh(3x) + cosh(3x)).relu()`` with ``sinh + cosh`` rewritten to ``exp * 1.001``;
- ``qwen3``: the tiny Qwen3 (``--model``) forward over a 6-token prompt, with every MLP's
  ``silu(gate) * up`` rewritten to ``gate * sigmoid(gate) * up * 1.001``.

For each, in fresh processes: ``bisect`` (its wall time, the layer, pass and node it names), and
PyTorch's accuracy minifier on the same script (``TORCHDYNAMO_REPRO_AFTER=dynamo``,
``TORCHDYNAMO_REPRO_LEVEL=4``; the ``aot`` level is Inductor-only): its wall time and whether it
reports the bad accuracy. ``--repeats`` runs of each; medians.

    python benchmarks/bisect_vs_minifier.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NAME = "bisect_vs_minifier"

SETUP = {
    "toy": """
import torch, npugraph_ex

def sinh_plus_cosh(x):
    return torch.sinh(x) + torch.cosh(x)

npugraph_ex.register_replacement(sinh_plus_cosh, lambda x: torch.exp(x) * 1.001, [torch.randn(4)])

def fn(x):
    return (sinh_plus_cosh(x * 3).relu() + 1).sum(-1)

torch.manual_seed(0)
args = (torch.randn(4, 8),)
""",
    "qwen3": """
import torch, npugraph_ex
from npugraph_ex.bench.presets import build_qwen3

def silu_mul(gate, up):
    return torch.nn.functional.silu(gate) * up

def silu_mul_off(gate, up):
    return gate * torch.sigmoid(gate) * up * 1.001

npugraph_ex.register_replacement(silu_mul, silu_mul_off, [torch.randn(2, 4), torch.randn(2, 4)])
model = build_qwen3("{model}", seed=0)

def fn(ids):
    return model(input_ids=ids, use_cache=False).logits

seeded = torch.Generator().manual_seed(0)
args = (torch.randint(0, model.config.vocab_size, (1, 6), generator=seeded),)
""",
}

BISECT = """
import time
from npugraph_ex.tools.bisection import bisect
started = time.time()
result = bisect(fn, *args, static_kernels=False)
seconds = time.time() - started
node = result.node
print(RESULT + json.dumps({"seconds": seconds, "layer": result.layer,
    "node": None if node is None else f"{node.name} ({node.op}) at {node.source}",
    "trials": len(result.trials)}))
"""

MINIFIER = """
import time
started = time.time()
try:
    with torch.no_grad():
        torch.compile(fn, backend="npugraph_ex")(*args)
    outcome = "no error raised: the wrong result went unreported"
except Exception as error:
    outcome = f"{type(error).__name__}: {error}"[:200]
print(RESULT + json.dumps({"seconds": time.time() - started, "outcome": outcome}))
"""

RESULT = "RESULT "


def child(case: str, tool: str, model: str) -> dict[str, Any]:
    source = "import json\nRESULT = 'RESULT '\n" + SETUP[case].replace("{model}", model)
    source += BISECT if tool == "bisect" else MINIFIER
    env = dict(os.environ)
    if tool == "minifier":
        env.update(TORCHDYNAMO_REPRO_AFTER="dynamo", TORCHDYNAMO_REPRO_LEVEL="4")
    with tempfile.TemporaryDirectory(prefix=NAME) as folder:
        # A file, so nodes have source lines; run in its folder, where the minifier writes.
        script = Path(folder) / f"{case}_repro.py"
        script.write_text(source)
        started = time.time()
        done = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True, text=True, env=env, cwd=folder, check=False,
        )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{case} {tool} failed:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len(RESULT) :])
    result["process_seconds"] = time.time() - started
    skipped = "Skipping this graph" in done.stderr
    result["minifier_skipped_graph"] = skipped if tool == "minifier" else None
    return result


def main() -> None:
    from common import (
        add_common_args,
        format_table,
        print_heading,
        settings_of,
        write_json,
    )

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="toy,qwen3")
    parser.add_argument("--model", default="tiny", help="the Qwen3 preset of the qwen3 case")
    add_common_args(parser, NAME, repeats=3)
    args = parser.parse_args()
    rows, record = [], {}
    for case in args.cases.split(","):
        runs = {tool: [] for tool in ("bisect", "minifier")}
        for _ in range(args.repeats):
            for tool in runs:
                runs[tool].append(child(case, tool, args.model))
        bisect, minifier = runs["bisect"][-1], runs["minifier"][-1]
        record[case] = runs
        rows.append([
            case, "npugraph_ex.tools.bisect",
            statistics.median(r["seconds"] for r in runs["bisect"]),
            f"{bisect['layer']}; {bisect['node']}",
        ])  # fmt: skip
        skipped = (
            " (it skipped the graph: it could not run it)"
            if minifier["minifier_skipped_graph"]
            else ""
        )
        rows.append([
            case, "accuracy minifier (repro_after=dynamo, level 4)",
            statistics.median(r["seconds"] for r in runs["minifier"]),
            minifier["outcome"] + skipped,
        ])  # fmt: skip
    print_heading(f"median of {args.repeats}")
    print(format_table(["case", "tool", "seconds (median)", "what it reports"], rows))
    write_json(args.out, NAME, settings_of(args), record)


if __name__ == "__main__":
    main()
