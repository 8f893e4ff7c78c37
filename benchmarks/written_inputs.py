"""What a call costs when the tensor it writes in place is new on every call.

Two workloads, each in three forms timed in one interleaved loop:

- ``cache row``: a module writes one row of a cache the caller allocates per call
  (``torch.zeros(--rows, 256)``), from a 256-wide linear layer, and returns the cache's sum;
- ``generate``: the tiny Qwen3's ``generate()`` with ``cache_implementation="static"`` (a new
  ``StaticCache`` per call: the prefill writes new tensors every time), 16 prompt tokens, 8 new.

Forms: eager; ``clone_input=False``, where every such call stays a capture (the graph has no
buffers of its own to copy into); the defaults, where after four captures in a row the graph
copies the written tensors into its own buffers before each replay and back after it (and the
same with ``static_kernel_compile=False``: a key on compiled kernels reads and writes the
caller's tensors themselves, the ATen replay its buffers). Results
are checked against eager, then each form is called until its kernel tier (the CPU default)
has no compile queued, running or on trial (at most ``--settle-s``), before timing.

    python benchmarks/written_inputs.py
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
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

from npugraph_ex.bench.presets import build_qwen3

FORMS = {
    "capture per call": {"clone_input": False},
    "copies in and out": {},
    "copies, ATen replay": {"static_kernel_compile": False},
}


class CacheRow(torch.nn.Module):
    """Writes one row of the caller's cache in place and reads the whole cache."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(256, 256)

    def forward(self, cache: torch.Tensor, row: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, row, self.proj(x))
        return cache.sum(0)


Calls = dict[str, tuple[Callable[[], Any], list[Any]]]
"""Each form's call, and the capture managers of its graphs."""


def checked(form: Callable[[], Any], expected: Any, equal: Callable[[Any, Any], Any]) -> list:
    """Six calls of ``form`` (past the four captures in a row) checked against ``expected``;
    the capture managers they made."""
    before = live_graph_numbers()
    for _ in range(6):
        equal(form(), expected)
    return managers_since(before)


def cache_row_calls(rows: int) -> Calls:
    torch.manual_seed(0)
    model = CacheRow().eval()
    row, x = torch.tensor([3]), torch.randn(1, 256)
    forms = {"eager": model}
    for name, options in FORMS.items():
        forms[name] = torch.compile(model, backend="npugraph_ex", options=options or None)
    calls = {name: (lambda fn=fn: fn(torch.zeros(rows, 256), row, x)) for name, fn in forms.items()}
    expected = calls["eager"]()
    return {n: (c, checked(c, expected, torch.testing.assert_close)) for n, c in calls.items()}


def tokens_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.equal(got, want)


def generate_calls() -> Calls:
    model = build_qwen3("tiny", seed=0)
    prompt = torch.randint(
        0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)
    )
    settings = dict(max_new_tokens=8, do_sample=False, cache_implementation="static")
    forms = {"eager": model}
    for name, options in FORMS.items():
        compiled = copy.deepcopy(model)
        compiled.forward = torch.compile(
            compiled.forward, backend="npugraph_ex", fullgraph=True, options=options or None
        )
        forms[name] = compiled
    calls = {name: (lambda m=m: m.generate(prompt, **settings)) for name, m in forms.items()}
    expected = calls["eager"]()
    return {n: (c, checked(c, expected, tokens_equal)) for n, c in calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512, help="rows of the cache (default 512)")
    add_settling_args(parser)
    add_common_args(parser, "written_inputs", repeats=7)
    args = parser.parse_args()
    apply_threads(args.threads)
    results: dict[str, Any] = {}
    rows = []
    with torch.no_grad():
        for workload, calls in (
            ("cache row", cache_row_calls(args.rows)),
            ("generate", generate_calls()),
        ):
            times = settled_times(calls, args, workload)
            results[workload] = times
            eager = median(times["eager"])
            for name, t in times.items():
                rows.append([workload, name, median(t) * 1e3, spread(t), eager / median(t)])
    print_heading("a written tensor new on every call: ms per call (median), speed-up over eager")
    print(format_table(["workload", "form", "ms per call", "spread", "x eager"], rows))
    write_json(args.out, "written_inputs", settings_of(args), {"times": results})


if __name__ == "__main__":
    main()
