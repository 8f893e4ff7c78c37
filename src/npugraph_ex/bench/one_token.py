"""Workloads ``token`` and ``window``: a fixed-length forward without a KV cache, fed its pick.

``token`` runs the model on a single token (``use_cache=False``) and feeds the argmax back as the
next step's only token: one fixed shape (``dynamic=False``, one graph key), no cache to update,
so the step is the model's kernels on one row and nothing else: the smallest forward there is.
``window`` runs the same over the last ``WINDOW_TOKENS`` tokens (a prompt's forward, a prefill
of that length, each step sliding the window by its pick): the kernels on many rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from npugraph_ex.bench.growing import Growing


@dataclass
class OneToken(Growing):
    """``new_tokens`` one-token forwards, each fed the token the last one picked."""

    name: str = "token"
    dynamic: bool = False
    first_label: str = "first call"

    def npugraph_options(self) -> Mapping[str, Any]:
        return {}

    def next_ids(self, ids: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        return torch.cat([ids[:, 1:], picked], dim=1)

    @property
    def title(self) -> str:
        return (
            f"token: one-token forward without a KV cache, {self.new_tokens} steps each fed the "
            "last pick (dynamic=False, one key)"
        )

    @property
    def chart_title(self) -> str:
        return f"token: one-token forward, no KV cache\n{self.new_tokens} steps, dynamic=False"

    def describe(self) -> dict[str, Any]:
        return {"steps": self.new_tokens, "tokens_per_step": 1, "use_cache": False}


WINDOW_TOKENS = 32


@dataclass
class Window(OneToken):
    """``new_tokens`` forwards of the last ``prompt.shape[1]`` tokens, each slid by its pick."""

    name: str = "window"

    @property
    def title(self) -> str:
        return (
            f"window: {self.prompt.shape[1]}-token forward without a KV cache, "
            f"{self.new_tokens} steps each sliding in the last pick (dynamic=False, one key)"
        )

    @property
    def chart_title(self) -> str:
        width = self.prompt.shape[1]
        return f"window: {width}-token forward, no KV cache\n{self.new_tokens} steps, dynamic=False"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "tokens_per_step": self.prompt.shape[1]}
