"""Workload ``decode``: a fixed-shape one-token decode step over a ``StaticCache``.

One token in, one position, a cache of fixed size written in place: every call has the same
shapes, so each compiled variant uses ``dynamic=False`` and npugraph_ex captures one key. The
cache is initialised up front, as a prefill would, so the step is traced once. The first call
pays compilation and capture; a timed block is ``steps`` decode steps from a reset cache.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from npugraph_ex.bench.workload import Generation

START_TOKEN = 1


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword under which ``model``'s forward takes its KV cache.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` and warns on the old name (removed
    in 5.40); earlier releases know only ``past_key_values``. The signature says which one this
    model takes, so the step passes the cache under the name its transformers asks for.
    """
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@dataclass
class Decode:
    """``steps`` one-token steps per block, with a cache of ``max_cache_len`` positions."""

    model: torch.nn.Module
    steps: int
    max_cache_len: int
    device: str
    sync: Callable[[], None]
    name: str = "decode"
    dynamic: bool = False
    first_label: str = "first call"

    @property
    def block_tokens(self) -> int:
        return self.steps

    @property
    def first_units(self) -> int:
        return self.steps

    def step(self) -> Callable[..., torch.Tensor]:
        model, keyword = self.model, cache_keyword(self.model)

        def step(ids: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
            return model(
                input_ids=ids, cache_position=pos, use_cache=True, **{keyword: cache}
            ).logits

        return step

    def npugraph_options(self) -> Mapping[str, Any]:
        return {}

    def new_cache(self) -> Any:
        """A static cache initialised up front, so the step has one graph from its first call."""
        from transformers import StaticCache

        config = self.model.config
        cache = StaticCache(config=config, max_cache_len=self.max_cache_len)
        cache.early_initialization(
            1,
            config.num_key_value_heads,
            config.head_dim,
            self.model.dtype,
            torch.device(self.device),
        )
        return cache

    def bind(self, fn: Callable[..., torch.Tensor]) -> DecodeRun:
        return DecodeRun(self, fn, self.new_cache())

    @property
    def title(self) -> str:
        return (
            f"decode: one-token step, StaticCache(max_cache_len={self.max_cache_len}), "
            f"{self.steps} steps per block (dynamic=False)"
        )

    @property
    def chart_title(self) -> str:
        return (
            f"decode: StaticCache({self.max_cache_len}), dynamic=False\n"
            f"{self.steps} one-token steps per block"
        )

    def describe(self) -> dict[str, Any]:
        return {
            "steps_per_block": self.steps,
            "max_cache_len": self.max_cache_len,
            "cache": "StaticCache",
        }


@dataclass
class DecodeRun:
    workload: Decode
    fn: Callable[..., torch.Tensor]
    cache: Any
    positions: list[torch.Tensor] = field(init=False)
    start_ids: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        device = self.workload.device
        self.positions = [torch.tensor([p], device=device) for p in range(self.workload.steps)]
        self.start_ids = torch.tensor([[START_TOKEN]], device=device)

    def first(self, advance: Callable[[], None]) -> tuple[float, Generation]:
        """The first call, timed; then the rest of a greedy run of ``steps`` tokens, untimed."""
        sync = self.workload.sync
        self.cache.reset()
        sync()
        start = time.perf_counter()
        logits = self.fn(self.start_ids, self.positions[0], self.cache)
        sync()
        seconds = time.perf_counter() - start
        advance()
        kept = [logits[:, -1].clone()]
        for pos in self.positions[1:]:
            ids = kept[-1].argmax(-1, keepdim=True)
            kept.append(self.fn(ids, pos, self.cache)[:, -1].clone())
            advance()
        self.cache.reset()
        tokens = [int(t.argmax(-1)) for t in kept]
        return seconds, Generation(tokens, [t[0].cpu() for t in kept])

    def block(self) -> float:
        sync = self.workload.sync
        self.cache.reset()
        sync()
        start = time.perf_counter()
        for pos in self.positions:
            self.fn(self.start_ids, pos, self.cache)
        sync()
        return time.perf_counter() - start
