"""A small MLP through ``cache_compile`` with ``static_kernel_compile="background"``, in a fresh
process, called until every key settles; prints a JSON report.

Run twice on one cache folder by ``test_background_cache``: the first process compiles its
kernels in a worker and stores those its keys keep, the second should start on them.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter

import torch

SETTLE_SECONDS = 120


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Messages(logging.Handler):
    """What npugraph_ex said: warnings, and every message (for a failing test's report)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.warnings: list[str] = []
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())
        if record.levelno >= logging.WARNING:
            self.warnings.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--rows", default="4", help="comma-separated row counts, one key each")
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--seed", type=int, default=0, help="of the model's weights")
    args = parser.parse_args()
    messages = Messages()
    logging.getLogger("npugraph_ex").addHandler(messages)
    logging.getLogger("npugraph_ex").setLevel(logging.DEBUG)

    import npugraph_ex.inference
    from npugraph_ex.bench.graphs import live_graph_numbers, managers_since

    torch.manual_seed(args.seed)
    model = Mlp()
    options = {"static_kernel_compile": "background", "background_compile_after": 2,
               "background_min_gain": 1e-9}  # fmt: skip  # kernels kept at any speed
    before = live_graph_numbers()
    cached = npugraph_ex.inference.cache_compile(
        model.forward, cache_dir=args.cache_dir, dynamic=args.dynamic, options=options
    )
    rows = [int(n) for n in args.rows.split(",")]
    calls, largest_diff = 0, 0.0
    deadline = time.monotonic() + SETTLE_SECONDS
    with torch.no_grad():
        while time.monotonic() < deadline:
            for n in rows:
                x = torch.randn(n, 32)
                largest_diff = max(largest_diff, float((cached(x) - model(x)).abs().max()))
                calls += 1
            managers = managers_since(before)  # one per graph: static keys of other sizes
            states = dict(
                sum((Counter(m.stats.summary()["background"]) for m in managers), Counter())
            )
            if not {"aten", "queued", "pending", "trial"} & set(states):
                break
            time.sleep(0.01)
    report = {
        "states": states,
        "compiles": sum(m.programs.kernels.sent for m in managers),
        "calls": calls,
        "trial_calls": sum(
            len(times)
            for m in managers
            for e in m.entries.values()
            for times in e.graph.times.values()
        ),
        "max_output_diff": largest_diff,
        "info": cached.cache_info(),
        "warnings": messages.warnings,
        "said": [m for m in messages.said if "background" in m or "kernels" in m],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
