"""The ``inductor+async`` variant: Inductor's ``async+subprocess`` mode for its compiles only, run
until the subprocess result is swapped in, and a clear failure where the mode cannot apply."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch._inductor.compile_fx as compile_fx

from npugraph_ex.bench.inductor_async import unsupported_reason
from npugraph_ex.bench.one_token import OneToken
from npugraph_ex.bench.output import table
from npugraph_ex.bench.progress import Progress
from npugraph_ex.bench.runner import WorkloadResult, run_workload

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unsupported_reason() is not None, reason=str(unsupported_reason())),
]

VOCAB = 64
STEPS = 4
VARIANTS = ["eager", "inductor+async"]


@dataclass
class Output:
    logits: torch.Tensor


class TinyLM(torch.nn.Module):
    """Embedding, one hidden layer, output layer: its graph holds ``torch.ops.aten`` ops only, so
    Inductor can send it to its subprocess. ``positions`` adds a position embedding indexed by
    ``torch.arange``, which Inductor lowers to ``prims.iota``: a graph it cannot send."""

    def __init__(self, positions: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.position = torch.nn.Embedding(8, 32) if positions else None
        self.hidden = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> Output:
        x = self.embed(input_ids)
        if self.position is not None:
            x = x + self.position(torch.arange(input_ids.shape[1]))
        return Output(self.head(torch.relu(self.hidden(x))))


def run(positions: bool) -> WorkloadResult:
    workload = OneToken(TinyLM(positions), torch.tensor([[3]]), STEPS, lambda: None)
    with torch.no_grad():
        return run_workload(workload, VARIANTS, repeats=1, device="cpu", progress=Progress())


def test_the_subprocess_compile_is_swapped_in_and_gives_eager_tokens() -> None:
    mode = (compile_fx.fx_compile_mode, compile_fx.fx_compile_async)
    result = run(positions=False)
    assert not result.failed
    record = result.record()
    figures = record["variants"]["inductor+async"]
    assert figures["tokens_match_eager"] is True
    assert figures["tokens_checked"] == STEPS
    assert figures["graph_states"] == {"swapped": 1}
    assert figures["settle_calls"] >= 1 and figures["settle_s"] >= 0
    assert figures["slowest_call_s"] >= figures["median_call_s"] > 0
    args = record["compile_args"]["by_variant"]["inductor+async"]
    assert args["backend"] == "inductor" and args["fx_compile_mode"] == "async+subprocess"
    assert "inductor+async: steady after" in table(result, "cpu")
    assert (compile_fx.fx_compile_mode, compile_fx.fx_compile_async) == mode  # for it alone


def test_a_graph_inductor_cannot_send_fails_the_variant_with_the_reason() -> None:
    result = run(positions=True)
    error = result.failed["inductor+async"]
    assert "no graph was compiled in a subprocess" in error
    assert "prims.iota" in error
    assert list(result.variants) == ["eager"]
    assert f"inductor+async failed: {error}" in table(result, "cpu")
