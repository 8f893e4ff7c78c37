"""Workload ``growing``: greedy generation over a growing sequence, without a KV cache.

Every step feeds the whole sequence so far (``use_cache=False``) and appends the argmax of the
last position, so every step has a new length: under ``dynamic=True`` Dynamo traces once, and
npugraph_ex captures one graph key per length (``capture_limit`` >= the number of lengths). The
first generation pays compilation and every capture; the later ones replay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from npugraph_ex.bench.workload import Generation

PROMPT_TOKENS = 4


def prompt_ids(vocab_size: int, length: int, seed: int, device: str) -> torch.Tensor:
    """A fixed prompt of ``length`` token ids drawn from ``seed`` (same on every device)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, length), generator=generator).to(device)


@dataclass
class Growing:
    """``new_tokens`` greedy tokens from ``prompt``, each step over the whole sequence."""

    model: torch.nn.Module
    prompt: torch.Tensor
    new_tokens: int
    sync: Callable[[], None]
    name: str = "growing"
    dynamic: bool = True
    first_label: str = "first run"

    @property
    def block_tokens(self) -> int:
        return self.new_tokens

    @property
    def first_units(self) -> int:
        return self.new_tokens

    @property
    def lengths(self) -> range:
        """The sequence lengths the steps see: one graph key each."""
        start = self.prompt.shape[1]
        return range(start, start + self.new_tokens)

    def step(self) -> Callable[..., torch.Tensor]:
        model = self.model

        def step(ids: torch.Tensor) -> torch.Tensor:
            return model(input_ids=ids, use_cache=False).logits

        return step

    def npugraph_options(self) -> Mapping[str, Any]:
        return {"capture_limit": len(self.lengths)}

    def bind(self, fn: Callable[..., torch.Tensor]) -> GrowingRun:
        return GrowingRun(self, fn)

    def next_ids(self, ids: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        """The next step's input: the sequence so far and the token just picked."""
        return torch.cat([ids, picked], dim=1)

    @property
    def title(self) -> str:
        prompt, count = self.prompt.shape[1], len(self.lengths)
        return (
            f"growing: greedy generation without a KV cache, {prompt}-token prompt + "
            f"{self.new_tokens} tokens ({count} lengths, dynamic=True)"
        )

    @property
    def chart_title(self) -> str:
        return (
            f"growing: no KV cache, dynamic=True\n{self.prompt.shape[1]}-token prompt + "
            f"{self.new_tokens} tokens ({len(self.lengths)} lengths)"
        )

    def describe(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt.shape[1],
            "new_tokens": self.new_tokens,
            "distinct_lengths": len(self.lengths),
            "use_cache": False,
        }


@dataclass
class GrowingRun:
    """A greedy generation of ``workload.new_tokens`` tokens from ``workload.prompt``, each step's
    input made by ``workload.next_ids`` (also the run of the ``token`` workload)."""

    workload: Growing
    fn: Callable[..., torch.Tensor]

    def generate(
        self, keep: list[torch.Tensor] | None, advance: Callable[[], None]
    ) -> list[torch.Tensor]:
        """The whole generation; the tokens picked. ``keep`` collects last-position logits."""
        ids = self.workload.prompt
        picks = []
        for _ in range(self.workload.new_tokens):
            last = self.fn(ids)[:, -1]
            if keep is not None:
                # A replay's outputs are the graph's memory, rewritten by its next replay.
                keep.append(last.clone())
            picks.append(last.argmax(-1, keepdim=True))
            ids = self.workload.next_ids(ids, picks[-1])
            advance()
        return picks

    def first(self, advance: Callable[[], None]) -> tuple[float, Generation]:
        logits: list[torch.Tensor] = []
        self.workload.sync()
        start = time.perf_counter()
        picks = self.generate(logits, advance)
        self.workload.sync()
        seconds = time.perf_counter() - start
        tokens = [int(pick) for pick in picks]
        return seconds, Generation(tokens, [t[0].cpu() for t in logits])

    def block(self) -> float:
        self.workload.sync()
        start = time.perf_counter()
        self.generate(None, lambda: None)
        self.workload.sync()
        return time.perf_counter() - start
