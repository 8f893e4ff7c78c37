"""One rank of a tensor-parallel Qwen3 decode: prints a JSON report.

    python tp_decode_run.py --rank R --world W --port P

Every rank builds the same model (the micro Qwen3 preset, one seed) and keeps a whole copy as the
reference; the other copies are split Megatron-style (``npugraph_ex.bench.tensor_parallel``).
First the model's own forward, with an all_reduce after each row-parallel linear: an eager
prefill fills a ``StaticCache`` holding this rank's heads, then decode steps run through
``torch.compile`` (``npugraph_ex``, static shapes) beside the whole model's. Then two sequences
as two micro-batches whose all_reduces run on a stream block (``TwoBatchStep``), against the
whole model decoding each sequence alone.
"""

from __future__ import annotations

import json

import torch
from gloo_group import join_gloo_group, leave_gloo_group
from torch import nn

STEPS = 6
PROMPT = 5


def decode(model: nn.Module, step: object, prompt: torch.Tensor) -> tuple[list, list]:
    """Eager prefill into a new StaticCache, then ``STEPS`` greedy steps through ``step``."""
    from transformers import StaticCache

    from npugraph_ex.bench.decode import cache_keyword

    cache = StaticCache(config=model.config, max_cache_len=PROMPT + STEPS + 1)
    state = {"use_cache": True, cache_keyword(model): cache}
    logits = model(input_ids=prompt, cache_position=torch.arange(PROMPT), **state).logits[:, -1]
    tokens, all_logits = [logits.argmax(-1, keepdim=True)], [logits]
    for index in range(STEPS):
        position = torch.tensor([PROMPT + index])
        out = step(input_ids=tokens[-1], cache_position=position, **state)
        all_logits.append(out.logits[:, -1].clone())
        tokens.append(all_logits[-1].argmax(-1, keepdim=True))
    return tokens, all_logits


def decode_two(step: nn.Module, compiled: object, prompts: torch.Tensor) -> list:
    """Eager prefill of both sequences through ``step``, then ``STEPS`` steps of ``compiled``."""
    from npugraph_ex.bench.tensor_parallel import causal_mask, new_caches

    length = PROMPT + STEPS + 1
    caches = new_caches(step.model, length)
    positions = torch.arange(PROMPT)
    logits = step(prompts, positions, causal_mask(positions, length), caches)[:, -1]
    tokens = [logits.argmax(-1, keepdim=True)]
    for index in range(STEPS):
        positions = torch.tensor([PROMPT + index])
        logits = compiled(tokens[-1], positions, causal_mask(positions, length), caches)[:, -1]
        tokens.append(logits.argmax(-1, keepdim=True))
    return torch.cat(tokens, 1).tolist()


def called_graphs() -> dict[str, int]:
    import npugraph_ex

    graphs = [g for g in npugraph_ex.stats()["graphs"] if g["captures"] or g["eager_calls"]]
    return {
        "captures": sum(g["captures"] for g in graphs),
        "replays": sum(g["replays"] for g in graphs),
        "eager_calls": sum(sum(g["eager_calls"].values()) for g in graphs),
        "graphs": len(graphs),
    }


def main() -> None:
    rank, world = join_gloo_group()
    import npugraph_ex
    from npugraph_ex.bench.presets import build_qwen3
    from npugraph_ex.bench.tensor_parallel import TwoBatchStep, shard

    with torch.no_grad():
        whole = build_qwen3("micro", seed=0)
        split = build_qwen3("micro", seed=0)
        shard(split, rank, world)
        prompts = torch.randint(
            0, whole.config.vocab_size, (2, PROMPT), generator=torch.Generator().manual_seed(1)
        )
        step = torch.compile(split.forward, backend="npugraph_ex", dynamic=False)
        tokens, logits = decode(split, step, prompts[:1])
        want = [decode(whole, whole.forward, prompts[i : i + 1]) for i in range(2)]
        one_model = called_graphs()
        npugraph_ex.reset_stats()
        partial = build_qwen3("micro", seed=0)
        shard(partial, rank, world, reduce=False)
        overlapped = TwoBatchStep(partial, overlap=True)
        compiled = torch.compile(overlapped, backend="npugraph_ex", dynamic=False, fullgraph=True)
        two_tokens = decode_two(overlapped, compiled, prompts)
    want_tokens, want_logits = want[0]
    diffs = [float((a - b).abs().max()) for a, b in zip(logits, want_logits, strict=True)]
    print(json.dumps({
        "tokens_equal": all(torch.equal(a, b) for a, b in zip(tokens, want_tokens, strict=True)),
        "max_logit_diff": max(diffs),
        **one_model,
        "two_batch_tokens_equal": two_tokens == [torch.cat(w[0], 1)[0].tolist() for w in want],
        "two_batch": called_graphs(),
    }))  # fmt: skip
    leave_gloo_group()


if __name__ == "__main__":
    main()
