"""Small seeded models shared by the tests.

Every builder seeds a forked RNG, so the weights are the same on every call and the caller's
random state is left untouched. Models come back in eval mode on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from npugraph_ex.bench.presets import QWEN3_PRESETS

TINY_QWEN3: dict[str, Any] = {**QWEN3_PRESETS["micro"], "max_position_embeddings": 256}


def make_tiny_qwen3(*, seed: int = 0, **overrides: Any) -> nn.Module:
    """A two-layer Qwen3 causal LM with random weights; ``overrides`` update ``TINY_QWEN3``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return seeded(lambda: Qwen3ForCausalLM(Qwen3Config(**{**TINY_QWEN3, **overrides})), seed)


def make_tiny_qwen2(*, seed: int = 0, **overrides: Any) -> nn.Module:
    """Qwen2 in ``TINY_QWEN3``'s sizes (``overrides`` update them): the same decoder, with a bias
    on the q, k and v projections and no q/k norms."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return seeded(lambda: Qwen2ForCausalLM(Qwen2Config(**{**TINY_QWEN3, **overrides})), seed)


def seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``build()``'s model, its weights drawn from ``seed`` in a forked RNG, in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    return model.eval()


class MLP(nn.Module):
    """LayerNorm → Linear → GELU → Linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(self.norm(x))))


def make_mlp(dim: int = 32, hidden: int = 64, *, seed: int = 0) -> nn.Module:
    """An MLP mapping ``(..., dim)`` to ``(..., dim)``."""
    return seeded(lambda: MLP(dim, hidden), seed)


class CNN(nn.Module):
    """Conv2d → BatchNorm2d → ReLU → MaxPool2d(2) → Linear over the flattened feature map."""

    def __init__(self, in_channels: int, channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.act = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(channels * (image_size // 2) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.act(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


def make_cnn(
    in_channels: int = 3,
    channels: int = 8,
    image_size: int = 16,
    num_classes: int = 10,
    *,
    seed: int = 0,
) -> nn.Module:
    """A CNN over ``(batch, in_channels, image_size, image_size)`` images.

    BatchNorm running statistics are randomised so that, in eval mode, the norm is not the identity
    and a pass that mishandles it changes the numerics.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CNN(in_channels, channels, image_size, num_classes)
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
    return model.eval()
