"""What a call with random ops costs now that the CPU replay captures them.

Two workloads, each in every form, timed in one interleaved loop:

- ``sampling step``: the tiny Qwen3's one-token decode step on a static cache (16 positions in
  turn, the cache reset at the first), with its next token sampled inside the compiled function
  (temperature, softmax, ``torch.multinomial``);
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
import itertools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
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

from npugraph_ex.bench.decode import Decode
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
    """How to make a form's call of the sampling step (each call the next of 16 positions of
    its own cache, reset at the first), and the step itself."""
    decode = Decode(build_qwen3("tiny", seed=0), 16, 64, "cpu", lambda: None)
    logits_of = decode.step()
    ids = torch.tensor([[5]])
    positions = [torch.tensor([p]) for p in range(decode.steps)]

    def step(ids: torch.Tensor, position: torch.Tensor, cache: Any) -> torch.Tensor:
        logits = logits_of(ids, position, cache)[:, -1]
        return torch.multinomial(torch.softmax(logits / 0.8, dim=-1), 1)

    def call_of(fn: Callable[..., Any]) -> Callable[[], Any]:
        cache = decode.new_cache()
        made = itertools.count()

        def call() -> Any:
            position = next(made) % decode.steps
            if position == 0:
                cache.reset()
            return fn(ids, positions[position], cache)

        return call

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


WORKLOADS = {"sampling step": sampling_step, "dropout MLP": dropout_mlp}


def checked_calls(
    workload: Callable[[], tuple], forms: list[str]
) -> dict[str, tuple[Callable[[], Any], list]]:
    """Eager's call and each of ``forms``' calls, each compiled one checked against a call of
    eager of its own under three seeds; the capture managers each form made."""
    call_of, fn = workload()
    calls = {"eager": (call_of(fn), [])}
    for name in forms:
        options = FORMS[name]
        before = live_graph_numbers()
        call, reference = call_of(compiled(fn, options)), call_of(fn)
        for seed in range(3):
            torch.manual_seed(seed)
            got = call()
            torch.manual_seed(seed)
            expected = reference()
            if options is not None:  # Inductor draws numbers of its own
                assert torch.equal(got == 0, expected == 0), name
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        calls[name] = (call, managers_since(before))
    return calls


def in_fresh_process(args: argparse.Namespace, workload: str, form: str) -> dict[str, list]:
    """One workload and form timed against eager in a fresh process with a fresh Inductor
    cache folder; the eager row named for the form's process."""
    with tempfile.TemporaryDirectory(prefix="npugraph_ex_random_ops_") as folder:
        out = Path(folder) / "record.json"
        command = [sys.executable, __file__, "--workloads", workload, "--forms", form]
        command += ["--out", str(out), "--calls", str(args.calls), "--repeats", str(args.repeats)]
        command += ["--warmup-calls", str(args.warmup_calls), "--settle-s", str(args.settle_s)]
        command += ["--threads", str(args.threads)] if args.threads else []
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(folder) / "inductor")}
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        times = json.loads(out.read_text())["results"]["times"][workload]
    return {f"eager ({form}'s process)": times["eager"], form: times[form]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_settling_args(parser)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--forms", default=",".join(FORMS), help="compiled forms, in one process")
    parser.add_argument(
        "--per-process",
        action="store_true",
        help="each workload and form in a fresh process and Inductor cache, against eager",
    )
    add_common_args(parser, "random_ops", repeats=7)
    args = parser.parse_args()
    apply_threads(args.threads)
    results: dict[str, Any] = {}
    rows = []
    with torch.no_grad():
        for workload in args.workloads.split(","):
            if args.per_process:
                times: dict[str, list] = {}
                for form in args.forms.split(","):
                    times.update(in_fresh_process(args, workload, form))
            else:
                forms = args.forms.split(",")
                times = settled_times(checked_calls(WORKLOADS[workload], forms), args, workload)
            results[workload] = times
            for name, t in times.items():
                # Against eager of the same process (a fresh process per form: its own eager).
                eager = times.get(f"eager ({name}'s process)") or times.get("eager") or t
                rows.append([workload, name, median(t) * 1e3, spread(t), median(eager) / median(t)])
    where = "each form in a fresh process and Inductor cache" if args.per_process else "one process"
    print_heading(f"calls with random ops ({where}): ms per call (median), speed-up over eager")
    print(format_table(["workload", "form", "ms per call", "spread", "x eager"], rows))
    write_json(args.out, "random_ops", settings_of(args), {"times": results})


if __name__ == "__main__":
    main()
