"""What a call with random ops costs now that the CPU replay captures them.

Two workloads, each in every form, timed in one interleaved loop:

- ``sampling step``: the tiny Qwen3's one-token decode step on a static cache, with its next
  token sampled inside the compiled function (temperature, softmax, ``torch.multinomial``);
- ``dropout MLP``: four 256-wide linear layers with GELU and dropout in training mode (called
  under ``no_grad``), a batch of 4 rows.

Forms: eager; the graph run eagerly (``force_eager=True``: what a graph with a random op got
before the CPU replay captured them); the ATen replay (``static_kernel_compile=False``); the
defaults (the kernel tier, settled on kernels or ATen); plain Inductor. Each call of a form is
checked against eager under one seed before timing (the sampled tokens and the dropped units equal,
the values within float32 rounding; Inductor draws its own numbers and is not checked).

    python benchmarks/random_ops.py
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from common import (
    add_common_args,
    apply_threads,
    format_table,
    interleaved,
    live_graph_numbers,
    managers_since,
    median,
    per_call,
    print_heading,
    settings_of,
    settle_keys,
    spread,
    write_json,
)

from npugraph_ex.bench.presets import build_qwen3

FORMS: dict[str, dict[str, Any] | None] = {
    "graph run eagerly": {"force_eager": True},
    "ATen replay": {"static_kernel_compile": False},
    "default": {},
    "inductor": None,
}
"""Each form's options for ``backend="npugraph_ex"``; None: ``backend="inductor"``."""


def compiled(fn: Callable[..., Any], options: dict[str, Any] | None) -> Callable[..., Any]:
    if options is None:
        return torch.compile(fn, backend="inductor", fullgraph=True)
    return torch.compile(fn, backend="npugraph_ex", fullgraph=True, options=options or None)


def sampling_step() -> tuple[Callable[[Callable[..., Any]], Callable[[], Any]], Callable]:
    """How to make a form's call of the sampling step, and the step itself."""
    from transformers import StaticCache

    model = build_qwen3("tiny", seed=0)
    ids = torch.tensor([[5]])

    def step(ids: torch.Tensor, cache: Any, position: torch.Tensor) -> torch.Tensor:
        logits = model(ids, past_key_values=cache, cache_position=position).logits[:, -1]
        return torch.multinomial(torch.softmax(logits / 0.8, dim=-1), 1)

    def call_of(fn: Callable[..., Any]) -> Callable[[], Any]:
        cache = StaticCache(config=model.config, max_cache_len=64)
        position = torch.tensor([16])  # a slot of the cache, rewritten on every call
        return lambda: fn(ids, cache, position)

    return call_of, step


class DropoutMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(4):
            layers += [torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Dropout(0.1)]
        self.layers = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def dropout_mlp() -> tuple[Callable[[Callable[..., Any]], Callable[[], Any]], Callable]:
    model = DropoutMlp()  # training mode: its dropout is active
    x = torch.randn(4, 256)
    return lambda fn: lambda: fn(x), model


def checked_calls(workload: Callable[[], tuple]) -> dict[str, tuple[Callable[[], Any], list]]:
    """Each form's call (eager's first), checked against eager under three seeds; the capture
    managers each form made."""
    call_of, fn = workload()
    calls = {}
    for name, options in {"eager": "eager", **FORMS}.items():
        before = live_graph_numbers()
        call = call_of(fn if options == "eager" else compiled(fn, options))
        for seed in range(3):
            torch.manual_seed(seed)
            got = call()
            if name == "eager" or options is None:
                continue
            torch.manual_seed(seed)
            expected = calls["eager"][0]()
            assert torch.equal(got == 0, expected == 0), name
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        calls[name] = (call, managers_since(before))
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20, help="calls per timed block")
    parser.add_argument("--warmup-calls", type=int, default=30, help="calls before timing")
    parser.add_argument(
        "--settle-s", type=float, default=120.0, help="longest wait for the kernel tier"
    )
    add_common_args(parser, "random_ops", repeats=7)
    args = parser.parse_args()
    apply_threads(args.threads)
    results: dict[str, Any] = {}
    rows = []
    with torch.no_grad():
        for workload, make in (("sampling step", sampling_step), ("dropout MLP", dropout_mlp)):
            calls = checked_calls(make)
            for name, (call, managers) in calls.items():
                states = settle_keys(call, managers, args.warmup_calls, args.settle_s)
                print(f"{workload}, {name}: keys {states}", flush=True)
            times = interleaved(
                {n: per_call(f, args.calls) for n, (f, _) in calls.items()}, args.repeats
            )
            results[workload] = times
            eager = median(times["eager"])
            for name, t in times.items():
                rows.append([workload, name, median(t) * 1e3, spread(t), eager / median(t)])
    print_heading("calls with random ops: ms per call (median), speed-up over eager")
    print(format_table(["workload", "form", "ms per call", "spread", "x eager"], rows))
    write_json(args.out, "random_ops", settings_of(args), {"times": results})


if __name__ == "__main__":
    main()
