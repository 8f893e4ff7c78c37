"""A serving loop with a compile in flight, to be signalled (``test_tier.py``).

Compiles a small model on the default tier, calls it until its key's compile is in flight in a
compile process, prints ``{"worker": PID}`` and keeps serving calls until a signal ends it.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import torch


def main() -> None:
    from npugraph_ex.kernels.processes import PROCESSES

    # Ctrl-C as an interactive Python has it, even when started with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
    fn = torch.compile(model, backend="npugraph_ex", options={"background_compile_after": 1})
    with torch.no_grad():
        while not any(p.busy for p in PROCESSES.processes):
            fn(torch.randn(4, 64))
        print(json.dumps({"worker": PROCESSES.processes[0].process.pid}), flush=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # serving, until signalled
            fn(torch.randn(4, 64))
    sys.exit("never signalled")


if __name__ == "__main__":
    main()
