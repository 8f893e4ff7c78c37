"""Greedy generation with a tiny Qwen3 whose prefill and decode are cached methods; prints JSON.

Run twice by ``test_qwen3_cache.py`` on one cache folder. A ``Generator`` module holds the model
and two methods, the TorchAir way: ``prefill`` (``dynamic=True``: prompts of any length) and
``decode`` (``dynamic=False``: one token), both writing a ``StaticCache`` in place. Each process
builds a new model and a new cache, so a warm process must bind its own buffers.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn

sys.path.insert(0, sys.argv[2])  # the tests folder, for the shared model builders

import npugraph_ex.inference  # noqa: E402
from models import make_tiny_qwen3  # noqa: E402

PROMPTS = (5, 7)
NEW_TOKENS = 4
MAX_LENGTH = 32


class Generator(nn.Module):
    def __init__(self, model: nn.Module, cache_dir: str) -> None:
        super().__init__()
        self.model = model
        self.cached_prefill = npugraph_ex.inference.cache_compile(
            self.prefill, cache_dir=cache_dir, dynamic=True
        )
        self.cached_decode = npugraph_ex.inference.cache_compile(
            self.decode, cache_dir=cache_dir, dynamic=False
        )

    def prefill(self, ids: torch.Tensor, cache: object, position: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, past_key_values=cache, cache_position=position).logits

    def decode(self, ids: torch.Tensor, cache: object, position: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, past_key_values=cache, cache_position=position).logits


def generate(prefill, decode, model: nn.Module, prompt: torch.Tensor) -> tuple[list[int], float]:
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=MAX_LENGTH)
    logits = prefill(prompt, cache, torch.arange(prompt.shape[1]))
    tokens = [int(logits[0, -1].argmax())]
    for step in range(NEW_TOKENS - 1):
        position = torch.tensor([prompt.shape[1] + step])
        logits = decode(torch.tensor([[tokens[-1]]]), cache, position)
        tokens.append(int(logits[0, -1].argmax()))
    return tokens, float(cache.layers[0].keys.abs().sum())


def main() -> None:
    generator = Generator(make_tiny_qwen3(), sys.argv[1])
    torch.manual_seed(0)
    prompts = [torch.randint(0, 200, (1, n)) for n in PROMPTS]
    report: dict[str, object] = {"equal": [], "cache_written": []}
    with torch.no_grad():
        for prompt in prompts:
            cached = generate(generator.cached_prefill, generator.cached_decode, generator.model,
                              prompt)  # fmt: skip
            eager = generate(generator.prefill, generator.decode, generator.model, prompt)
            report["equal"].append(cached == eager)
            report["cache_written"].append(cached[1] > 0)
    from torch._dynamo.utils import counters

    report["traced"] = counters["stats"]["unique_graphs"]
    report["prefill"] = generator.cached_prefill.cache_info()
    report["decode"] = generator.cached_decode.cache_info()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
