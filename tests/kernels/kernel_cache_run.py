"""Compiles a small model with ``static_kernel_compile`` in a fresh process and reports as JSON.

Run by ``test_static_compile.py`` (twice in one Inductor cache directory, to see the second
process load what the first compiled). Prints one JSON line: the graph's counters and the
largest differences from eager, for the outputs and for the buffer the model writes in place.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from torch import nn

import npugraph_ex

SHAPES = (3, 5, 3)


class Accumulate(nn.Module):
    """A linear layer that also sums what it saw into a buffer (an input mutation)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("total", torch.zeros(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.lin(x))
        self.total.add_(y.sum(0))
        return y * 2


def main() -> None:
    torch.manual_seed(0)
    model = Accumulate().eval()
    reference = copy.deepcopy(model)
    options = {"static_kernel_compile": True}
    if "--disable-cache" in sys.argv:
        options["disable_static_kernel_compile_cache"] = True
    if "--rows-with-kernels" in sys.argv:  # TorchAir's spelling of static_kernel_sym_values
        rows = int(sys.argv[sys.argv.index("--rows-with-kernels") + 1])
        options["_vllm_aclnn_static_kernel_sym_range"] = [rows]
    compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True, dynamic=True,
                             options=options)  # fmt: skip
    diffs = []
    with torch.no_grad():
        for rows in SHAPES:
            x = torch.randn(rows, 16)
            diffs.append(float((compiled(x) - reference(x)).abs().max()))
    [graph] = npugraph_ex.stats()["graphs"]
    report = {
        "static_kernels": graph["static_kernels"],
        "captures": graph["captures"],
        "replays": graph["replays"],
        "eager_calls": graph["eager_calls"],
        "max_output_diff": max(diffs),
        "buffer_diff": float((model.total - reference.total).abs().max()),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
