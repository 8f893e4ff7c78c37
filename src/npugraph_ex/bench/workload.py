"""What a benchmark workload is, and how a variant's greedy tokens are checked against eager's.

A workload hands out its plain step function (each variant compiles its own copy) and binds a
prepared step to the state it runs on (``Run``): a timed first run, which pays compilation and
capture and records the greedy tokens, and a timed block of steady work, called once per repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class Generation:
    """The greedy tokens of one variant's first run, and the last-position logits of each step."""

    tokens: list[int]
    logits: list[torch.Tensor]


@dataclass(frozen=True)
class Agreement:
    """How a variant's greedy run compares with eager's."""

    agree: int
    """Positions whose token equals eager's."""
    checked: int
    max_abs_logit_diff: float
    """Largest |logit difference| over the steps whose inputs were identical to eager's."""

    @property
    def all_agree(self) -> bool:
        return self.agree == self.checked


def agreement(reference: Generation, got: Generation) -> Agreement:
    """Compare ``got`` with ``reference`` token by token, and their logits while comparable.

    Step ``i`` of a greedy run is fed the tokens picked before it, so its logits can be compared
    only while every earlier pick agreed; after the first differing pick the inputs differ and a
    logit difference would say nothing about the backend.
    """
    checked = min(len(reference.tokens), len(got.tokens))
    agree = sum(a == b for a, b in zip(reference.tokens, got.tokens, strict=False))
    worst = 0.0
    for i in range(checked):
        diff = (reference.logits[i].float() - got.logits[i].float()).abs().max()
        worst = max(worst, float(diff))
        if reference.tokens[i] != got.tokens[i]:
            break
    return Agreement(agree=agree, checked=checked, max_abs_logit_diff=worst)


class Run(Protocol):
    """One variant's step bound to its own state (its inputs, its cache)."""

    def first(self, advance: Callable[[], None]) -> tuple[float, Generation]:
        """Seconds of the first call or run (compile and capture included), and its tokens.

        ``advance`` is called once per unit of ``Workload.first_units`` (progress).
        """

    def block(self) -> float:
        """Seconds of one timed block of ``Workload.block_tokens`` tokens."""


class Workload(Protocol):
    name: str
    dynamic: bool
    """``torch.compile(dynamic=...)`` for every compiled variant."""
    block_tokens: int
    """Tokens one timed block produces (tokens/s = this / seconds)."""
    first_units: int
    """Progress units of the first run."""
    first_label: str
    """What the timed first run is called in reports (``first run``, ``first call``)."""

    def step(self) -> Callable[..., torch.Tensor]:
        """The plain step (returns logits); variants compile copies of it."""

    def npugraph_options(self) -> Mapping[str, Any]:
        """Options npugraph_ex variants need for this workload (a ``capture_limit``)."""

    def bind(self, fn: Callable[..., torch.Tensor]) -> Run:
        """``fn`` (the step as one variant runs it) with fresh state of its own."""

    @property
    def title(self) -> str:
        """One line saying what the workload runs, for the report."""

    @property
    def chart_title(self) -> str:
        """The same on two short lines, for a chart panel."""

    def describe(self) -> dict[str, Any]:
        """The workload's shape, for the JSON record."""
