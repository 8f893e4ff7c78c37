"""One key's whole life on the kernel tier, in a fresh process, counting the Python calls every
other thread makes meanwhile and the commands its first load runs; prints a JSON report.

A fresh process, because the first load of kernels in a process is where Inductor's host probes
would run (about 60,000 Python calls); ``test_no_stall`` runs it. The serving thread's replay
takes the interpreter lock back after every kernel, so every Python call another thread makes
while a key serves is time the replay may wait for: the tier makes few, by construction.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from typing import Any

import torch

SETTLE_SECONDS = 120


class CallCounter:
    """Python function calls by thread name, for threads other than the one that made it."""

    def __init__(self) -> None:
        self.serving = threading.get_ident()
        self.calls: Counter[str] = Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and threading.get_ident() != self.serving:
            self.calls[threading.current_thread().name] += 1


class LoadCommands:
    """The commands child processes run while the tier loads kernels (the first load in a
    process would run the host's compiler, were its answers not taken from the compile
    process: ``runtime/cpu/host_answers``)."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.loading = False

    def watch(self) -> None:
        import subprocess

        import npugraph_ex.kernels.tier as tier

        load, popen_init = tier.load_compiled, subprocess.Popen.__init__

        def counted_load(*args: Any, **kwargs: Any) -> Any:
            self.loading = True
            try:
                return load(*args, **kwargs)
            finally:
                self.loading = False

        def recorded_init(process: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
            if self.loading:
                self.commands.append([str(a) for a in ([args] if isinstance(args, str) else args)])
            popen_init(process, args, *rest, **kwargs)

        tier.load_compiled = counted_load
        subprocess.Popen.__init__ = recorded_init


def main() -> None:
    from npugraph_ex.bench.graphs import live_graph_numbers, managers_since

    loads = LoadCommands()
    loads.watch()

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 32),
    )  # fmt: skip
    options = {"static_kernel_compile": "background", "background_compile_after": 2,
               "background_min_gain": 1e-9}  # fmt: skip  # kernels kept at any speed
    before = live_graph_numbers()
    fn = torch.compile(model, backend="npugraph_ex", options=options)
    counter = CallCounter()
    states: list[str] = []
    largest_diff = 0.0
    with torch.no_grad():
        fn(torch.randn(4, 32))  # the capture (the graph's bytes are made here)
        (manager,) = managers_since(before)
        (key,) = manager.entries.values()
        threading.setprofile(counter)  # every thread started from now on
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            x = torch.randn(4, 32)
            largest_diff = max(largest_diff, float((fn(x) - model(x)).abs().max()))
            if not states or states[-1] != key.graph.state.value:
                states.append(key.graph.state.value)
            if key.graph.settled:
                break
            time.sleep(0.002)
        threading.setprofile(None)
    report = {
        "states": states,
        "reason": key.graph.reason,
        "other_threads_calls": dict(counter.calls),
        "max_output_diff": largest_diff,
        "load_commands": loads.commands,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
