"""A process forked with one function on its kernels (``static_kernel_compile=True``) and
another's compile in flight (the default); prints a JSON report of the child and the parent
after it (``test_tier.py`` asserts on it).

Before the fork, both functions ran parallel regions (two intra-op threads): GNU OpenMP's team
does not exist in the child, whose next parallel region would wait for it forever. The child
calls both functions with new inputs (under a watchdog that ends it and reports where it
hung), compares them with eager, looks at what it holds of the parent's compile processes and
exits normally (its exit handlers run). The parent then waits for the child, lets its own
compile finish and checks that its compile process survived the child's exit.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import torch

SETTLE_SECONDS = 240
CHILD_SECONDS = 120
OPTIONS = {"background_compile_after": 2}


def settle(fn, inputs, want):  # noqa: ANN001, ANN201
    """Call ``fn`` until its key reaches one of the states in ``want``; the state."""
    import npugraph_ex

    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        fn(inputs())
        graph = npugraph_ex.stats()["graphs"][-1]
        states = set(graph.get("background", {}))
        if states & want:
            return sorted(states)
        time.sleep(0.005)
    return sorted(states)


def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    settled = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)
    )
    pending = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 32)
    )
    return settled.eval(), pending.eval()


def agree(fn, model) -> bool:  # noqa: ANN001
    x = torch.randn(64, 256)
    return bool(torch.allclose(fn(x), model(x), atol=1e-5, rtol=1e-4))


def child(report: int, fns, eager) -> None:  # noqa: ANN001
    from npugraph_ex.kernels.processes import PROCESSES

    faulthandler.dump_traceback_later(CHILD_SECONDS, exit=True)
    started = time.monotonic()
    results = [agree(fn, model) for fn, model in zip(fns, eager, strict=True)]
    results += [agree(fn, model) for fn, model in zip(fns, eager, strict=True)]
    found = {
        "child_results": results,
        "child_seconds": round(time.monotonic() - started, 2),
        "child_threads": torch.get_num_threads(),
        "child_processes": len(PROCESSES.processes),
    }
    os.write(report, json.dumps(found).encode())
    os.close(report)
    sys.exit(0)  # a normal exit: the exit handlers run


def main() -> None:
    from npugraph_ex.kernels.processes import PROCESSES

    torch.set_num_threads(2)
    settled_model, pending_model = models()
    with torch.no_grad():
        # Kernels from its first call (``True``), where a trial could keep the ATen replay.
        static = {"static_kernel_compile": True}
        on_kernels = torch.compile(settled_model, backend="npugraph_ex", options=static)
        for _ in range(3):
            on_kernels(torch.randn(64, 256))
        states = {}
        in_flight = torch.compile(pending_model, backend="npugraph_ex", options=OPTIONS)
        states["pending"] = settle(in_flight, lambda: torch.randn(64, 256), {"pending"})
        workers = [p.process.pid for p in PROCESSES.processes]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            child(write, (on_kernels, in_flight), (settled_model, pending_model))
        os.close(write)
        with os.fdopen(read) as pipe:
            report = json.loads(pipe.read() or "{}")
        _, status = os.waitpid(pid, 0)
        report["child_status"] = os.waitstatus_to_exitcode(status)
        report["states_at_fork"] = states
        report["workers_alive_after_child"] = [
            p.process.poll() is None for p in PROCESSES.processes
        ]
        report["workers_at_fork"] = len(workers)
        report["parent_later"] = settle(
            in_flight, lambda: torch.randn(64, 256), {"kernels", "aten kept: slower"}
        )
        report["parent_results"] = [
            agree(on_kernels, settled_model),
            agree(in_flight, pending_model),
        ]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
