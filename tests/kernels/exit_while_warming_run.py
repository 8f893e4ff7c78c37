"""A process that ends while loaded kernels make their first run in a thread; exits 0 when the
end is clean.

The first run is compiled code that leaves the interpreter lock and takes it back when done: a
daemon thread doing that while the interpreter finalizes is ended inside C++ and aborts the
process ("terminate called without an active exception"). ``test_tier.py`` runs it and checks
the exit status. Prints the key's state when the process ended (it must be "pending", with the
first run under way).
"""

from __future__ import annotations

import time

import torch

SETTLE_SECONDS = 120


def main() -> None:
    from npugraph_ex.bench.graphs import live_graph_numbers, managers_since

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)])
    options = {"static_kernel_compile": "background", "background_compile_after": 2}
    before = live_graph_numbers()
    fn = torch.compile(model, backend="npugraph_ex", options=options)
    with torch.no_grad():
        fn(torch.randn(1024, 2048))
        (manager,) = managers_since(before)
        (key,) = manager.entries.values()
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline and "first run" not in key.graph.reason:
            fn(torch.randn(1024, 2048))
            time.sleep(0.001)
    print(key.graph.state.value, key.graph.reason)


if __name__ == "__main__":
    main()
