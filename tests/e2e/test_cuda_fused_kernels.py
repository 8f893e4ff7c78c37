"""The CUDA platform's fused kernels on a GPU: the seed's model as it asks for it (eager attention,
half precision) gets one fused attention per layer and, where this PyTorch has a CUDA kernel of
it, ``_fused_rms_norm`` for every norm; its logits stay within half precision of eager's."""

from __future__ import annotations

import pytest
import torch

from helpers import GraphRecorder
from models import TINY_QWEN3, make_tiny_qwen3
from npugraph_ex.runtime.platform import FUSED_RMS_NORM, platform_for

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
]

aten = torch.ops.aten
ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_eager_attention_and_norms_become_fused_kernels_in_half_precision(dtype) -> None:
    pytest.importorskip("transformers")
    model = make_tiny_qwen3(attn_implementation="eager").to("cuda", dtype)
    recorder = GraphRecorder()
    compiled = torch.compile(
        model,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=True,
        options={"post_grad_custom_post_pass": recorder},
    )
    ids = torch.randint(1, TINY_QWEN3["vocab_size"], (1, 7), device="cuda")
    expected = model(input_ids=ids, use_cache=False).logits
    for _ in range(2):  # the capture, then a replay
        logits = compiled(input_ids=ids, use_cache=False).logits
        torch.testing.assert_close(logits, expected, atol=3e-2, rtol=3e-2)
        del logits
    targets = [str(n.target) for n in recorder.only().nodes if n.op == "call_function"]
    layers = TINY_QWEN3["num_hidden_layers"]
    assert sum(any(name in t for name in ATTENTION) for t in targets) == layers, targets
    assert not any("_softmax" in t for t in targets)
    norms = sum(t == str(aten._fused_rms_norm.default) for t in targets)
    fused = FUSED_RMS_NORM in platform_for("cuda").fused_kernels()
    assert norms == (4 * layers + 1 if fused else 0)
