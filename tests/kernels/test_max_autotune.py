"""``mode="max-autotune"``: the whole graph through Inductor with autotuning, nothing captured."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import npugraph_ex
from models import make_mlp

ATOL = 1e-5
"""Inductor's fused loops sum in another order than ATen's kernels."""


SPELLINGS = {
    "options": {"options": {"mode": "max-autotune"}},
    "torch.compile mode": {"mode": "max-autotune"},
}


@pytest.mark.slow
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_max_autotune_compiles_the_whole_graph_and_captures_nothing(spelling: str) -> None:
    model = make_mlp()
    compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True, **SPELLINGS[spelling])
    counters.clear()
    with torch.no_grad():
        for rows in (4, 4):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=0)
    inductor = counters["inductor"]
    assert inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_hit"] == 1
    # No capture manager saw a call: Inductor's code runs on every call.
    totals = npugraph_ex.stats()["totals"]
    assert (totals["captures"], totals["replays"], totals["eager_calls"]) == (0, 0, 0)
