"""Does a key whose kernels lost their trial while other processes loaded the cores reach its
kernels once the load is gone, and what does a call cost before and after?

The tiny Qwen3's one-token forward on the CPU default (``static_kernel_compile="background"``),
each repeat in a fresh process with a fresh Inductor cache folder: its first call, then
``--load`` co-tenant processes (each multiplying 384x384 matrices on two threads, as a server's
other workers loading and compiling would) until the key's trial decides; then the co-tenants
stop and the key serves on a quiet host:

    after the loaded trial   calls of the key and of eager, interleaved, right after the load
    after the re-trial       the same, once the key was tried again (``RETRIAL_SECONDS``)

    python benchmarks/trial_under_load.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CO_TENANT = (
    "import torch\ntorch.set_num_threads(2)\na = torch.randn(384, 384)\nwhile True:\n    a @ a\n"
)
LIMIT_S = 600.0


def timed_rounds(calls: dict[str, Any], rounds: int, per_round: int) -> dict[str, float]:
    """Median seconds a call of each of ``calls``, interleaved round by round."""
    from common import interleaved, median, time_calls

    blocks = {name: lambda call=call: time_calls(call, per_round) for name, call in calls.items()}
    return {name: median(t) for name, t in interleaved(blocks, rounds).items()}


def measure(co_tenants: int) -> dict[str, Any]:
    """In this process: the key's decision under load, its calls after, and after a re-trial."""
    import torch
    from common import qwen3_token_forward

    from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
    from npugraph_ex.capture.tiers import SETTLED, KeyState

    forward, (ids,) = qwen3_token_forward()
    before = live_graph_numbers()
    fn = torch.compile(forward, backend="npugraph_ex", dynamic=False)
    result: dict[str, Any] = {"co_tenants": co_tenants}
    with torch.no_grad():
        fn(ids)
        (manager,) = managers_since(before)
        (entry,) = manager.entries.values()
        key = entry.graph
        load = [subprocess.Popen([sys.executable, "-c", CO_TENANT]) for _ in range(co_tenants)]
        started = time.monotonic()
        try:
            while key.state not in SETTLED and time.monotonic() - started < LIMIT_S:
                fn(ids)
                time.sleep(0.001)
        finally:
            for process in load:
                process.kill()
                process.wait()
        decided = time.monotonic()
        result["decision"] = key.reason
        result["decision_s"] = round(decided - started, 1)
        time.sleep(1.0)
        calls = {"npugraph_ex": lambda: fn(ids), "eager": lambda: forward(ids)}
        result["after the loaded trial"] = timed_rounds(calls, 5, 20)
        while key.state is KeyState.SLOWER and key.retrial_at is not None:
            fn(ids)
            time.sleep(0.001)
        while key.state not in SETTLED:  # the re-trial's calls
            fn(ids)
        result["kernels_after_s"] = round(time.monotonic() - decided, 1)
        result["final"] = key.reason
        result["after the re-trial"] = timed_rounds(calls, 5, 20)
    return result


def child(co_tenants: int) -> dict[str, Any]:
    """``measure`` in a fresh process with a fresh Inductor cache folder."""
    with tempfile.TemporaryDirectory(prefix="npugraph_ex_trial_") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        command = [sys.executable, __file__, "--one", str(co_tenants)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows_of(result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for phase in ("after the loaded trial", "after the re-trial"):
        times = result[phase]
        compiled, eager = times["npugraph_ex"], times["eager"]
        rows.append(
            [phase, f"{compiled * 1e3:.3f}", f"{eager * 1e3:.3f}", f"{eager / compiled:.2f}x"]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", type=int, default=2, help="co-tenant processes (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes (default 3)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/trial_under_load.json"))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    from common import environment, environment_line, format_table, write_json

    results = [child(args.load) for _ in range(args.repeats)]
    headers = ["phase", "npugraph_ex ms", "eager ms", "speed-up"]
    for number, result in enumerate(results, 1):
        print(
            f"repeat {number}: decided after {result['decision_s']} s under load: "
            f"{result['decision']}"
        )
        if result["decision"] != "on kernels":
            print(f"  then {result['final']} {result['kernels_after_s']} s after the decision")
        print(format_table(headers, rows_of(result)))
    print(environment_line(environment()))
    write_json(args.out, "trial_under_load", vars(args), results)


if __name__ == "__main__":
    main()
