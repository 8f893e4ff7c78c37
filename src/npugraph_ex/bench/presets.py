"""The Qwen3 causal LMs the benchmarks build: configs only, random weights, no download.

``QWEN3_PRESETS`` holds the small configs every benchmark script offers (``--preset``);
``QWEN3_MODELS`` adds the real Qwen3-0.6B architecture, which only ``npugraph-ex bench`` offers
because it takes minutes, not seconds, on a small CPU.
"""

from __future__ import annotations

from typing import Any

import torch

QWEN3_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=4096,
    ),
    "micro": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
    ),
}
"""Qwen3 configs (random weights) the benchmarks build: ``tiny`` (4.5M parameters) and ``micro``."""

QWEN3_0_6B: dict[str, Any] = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
)
"""The published Qwen3-0.6B architecture (0.6B parameters, 2.4 GB in float32)."""

QWEN3_MODELS: dict[str, dict[str, Any]] = {**QWEN3_PRESETS, "qwen3-0.6b": QWEN3_0_6B}
"""Every model ``npugraph-ex bench --model`` builds, by name."""

MIN_POSITIONS = 512


def qwen3_config(
    name: str, positions: int = MIN_POSITIONS, attn_implementation: str | None = None
) -> Any:
    """The ``Qwen3Config`` of model ``name``, with room for at least ``positions`` positions.

    The small presets leave every other field at transformers' default, so their figures stay
    comparable with earlier runs; so does ``attn_implementation=None`` (transformers' choice).
    """
    from transformers import Qwen3Config

    fields = dict(QWEN3_MODELS[name])
    fields["max_position_embeddings"] = max(
        fields.get("max_position_embeddings", MIN_POSITIONS), positions
    )
    return Qwen3Config(**fields, attn_implementation=attn_implementation)


def build_qwen3(
    name: str,
    *,
    seed: int,
    device: str = "cpu",
    positions: int = MIN_POSITIONS,
    attn_implementation: str | None = None,
) -> torch.nn.Module:
    """``Qwen3ForCausalLM`` of model ``name`` in eval mode, weights drawn from ``seed``.

    The global random state is left as it was, so building a model does not change what later
    code draws.
    """
    from transformers import Qwen3ForCausalLM

    config = qwen3_config(name, positions, attn_implementation)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).eval()
    return model.to(device)


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once, as ``parameters()`` yields them)."""
    return sum(p.numel() for p in model.parameters())
