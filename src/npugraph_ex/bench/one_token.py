"""Workload ``token``: the forward of one token without a KV cache, fed its own greedy pick.

Each step runs the model on a single token (``use_cache=False``) and feeds the argmax back as the
next step's only token: one fixed shape (``dynamic=False``, one graph key), no cache to update,
so the step is the model's kernels on one row and nothing else: the smallest forward there is.
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
        return picked

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
