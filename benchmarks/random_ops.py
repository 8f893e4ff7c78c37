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

import itertools
from collections.abc import Callable
from typing import Any

import forms
import torch

from npugraph_ex.bench.decode import Decode
from npugraph_ex.bench.presets import build_qwen3


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


def check(form: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    """The sampled tokens and the dropped units equal, the values within float32 rounding
    (plain Inductor draws numbers of its own: not checked)."""
    if forms.FORMS[form] is not None:
        assert torch.equal(got == 0, expected == 0), form
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    forms.main(__file__, WORKLOADS, check, "calls with random ops")
