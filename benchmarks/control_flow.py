"""What a call with control flow costs now that the CPU replay captures ``torch.cond``.

Two workloads, each in every form (``forms.py``), timed in one interleaved loop; each call's
input is the next of 8 made at the start, so that the branches taken change from call to call:

- ``expert choice``: one token through four layers of a two-expert mixture, each layer choosing
  its expert with ``torch.cond`` on its router's larger logit (256 wide, experts of 512);
- ``early exit``: a classifier of eight 256-wide layers that, after the fourth, returns its
  early head's answer where that head is confident (``torch.cond`` on the top probability) and
  otherwise runs the other four; a batch of one.

Each compiled form is checked against eager before timing (within float32 rounding).

    python benchmarks/control_flow.py
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import forms
import torch
from torch import nn

WIDTH, HIDDEN, INPUTS = 256, 512, 8


class TwoExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(WIDTH)
        self.router = nn.Linear(WIDTH, 2)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, WIDTH))
            for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        logits = self.router(h)
        first, second = self.experts
        chosen = torch.cond(logits[0, 0] > logits[0, 1], first, second, (h,))
        return x + chosen


class EarlyExit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(8)
        )
        self.early_head = nn.Linear(WIDTH, 10)
        self.head = nn.Linear(WIDTH, 10)
        with torch.no_grad():  # random weights leave every class near 0.1: a sharper head
            self.early_head.weight.mul_(20)

    def late(self, h: torch.Tensor, early: torch.Tensor) -> torch.Tensor:
        for block in self.blocks[4:]:
            h = block(h)
        return self.head(h).softmax(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for block in self.blocks[:4]:
            h = block(h)
        early = self.early_head(h).softmax(-1)
        return torch.cond(early.max() > 0.2, lambda h, e: e.clone(), self.late, (h, early))


def cycling(model: nn.Module, inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """How to make a form's call of ``model``: each call on the next of ``inputs``."""

    def call_of(fn: Callable[..., Any]) -> Callable[[], Any]:
        made = itertools.cycle(inputs)
        return lambda: fn(next(made))

    return call_of


def expert_choice() -> tuple[Callable[..., Any], Callable]:
    torch.manual_seed(0)
    model = nn.Sequential(*(TwoExperts() for _ in range(4))).eval()
    return cycling(model, [torch.randn(1, WIDTH) for _ in range(INPUTS)]), model


def early_exit() -> tuple[Callable[..., Any], Callable]:
    torch.manual_seed(0)
    model = EarlyExit().eval()
    # The early head is confident on three of the eight (the second, sixth and eighth).
    inputs = [torch.randn(1, WIDTH) * (8.0 if i % 2 else 1.0) for i in range(INPUTS)]
    return cycling(model, inputs), model


WORKLOADS = {"expert choice": expert_choice, "early exit": early_exit}


def check(form: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    forms.main(__file__, WORKLOADS, check, "calls with torch.cond")
