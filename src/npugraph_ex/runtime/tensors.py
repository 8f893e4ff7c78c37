"""The tensors among nested values, for every stage that walks a kernel's arguments or a node's
fake value (device-free)."""

from __future__ import annotations

from typing import Any

import torch


def tensors_in(values: Any) -> list[torch.Tensor]:
    """The tensors in ``values`` in order, through nested lists, tuples and dicts: what
    ``pytree.tree_leaves`` finds among a kernel's arguments and results, at a fraction of its
    cost (a capture asks for them several times per kernel)."""
    found: list[torch.Tensor] = []
    collect_tensors(values, found)
    return found


def collect_tensors(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            collect_tensors(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            collect_tensors(item, found)
