"""A fast, deterministic slice of the OpInfo sweep (``opinfo_sweep.py``; the whole database runs
with ``make sweep``): ops chosen for breadth, one or two samples each, each called three times
(capture, then two replays on renewed inputs) and compared with ``aot_eager``."""

from __future__ import annotations

import pytest
import torch
from opinfo_sweep import (
    EQUAL,
    FALLBACK,
    NO_GRAPH,
    Target,
    dynamo_limits,
    run_target,
    select_targets,
)

pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest")

pytestmark = pytest.mark.sweep

F32, BF16, I64 = torch.float32, torch.bfloat16, torch.int64

# (OpInfo name, dtype, the class it must have, what its reason must contain), by family.
CASES = [
    # elementwise: unary, binary, Python numbers, bitwise and shifts
    ("abs", F32, EQUAL, ""),
    ("sigmoid", F32, EQUAL, ""),
    ("nn.functional.gelu", F32, EQUAL, ""),
    ("add", F32, EQUAL, ""),
    ("mul[operator]", F32, EQUAL, ""),
    ("div.no_rounding_mode", F32, EQUAL, ""),
    ("pow", F32, EQUAL, ""),
    ("clamp", F32, EQUAL, ""),
    ("where", F32, EQUAL, ""),
    ("remainder", I64, EQUAL, ""),
    ("bitwise_and[operator]", I64, EQUAL, ""),
    ("bitwise_left_shift", I64, EQUAL, ""),
    ("bitwise_left_shift[operator]", I64, EQUAL, ""),
    ("bitwise_right_shift[operator]", I64, EQUAL, ""),
    # reductions, scans, sorting
    ("sum", F32, EQUAL, ""),
    ("amax", F32, EQUAL, ""),
    ("var", F32, EQUAL, ""),
    ("logsumexp", F32, EQUAL, ""),
    ("cumsum", F32, EQUAL, ""),
    ("sort", F32, EQUAL, ""),
    ("topk", F32, EQUAL, ""),
    ("argmax", F32, EQUAL, ""),
    # products
    ("mm", F32, EQUAL, ""),
    ("addmm", F32, EQUAL, ""),
    ("bmm", F32, EQUAL, ""),
    ("matmul[operator]", F32, EQUAL, ""),
    ("nn.functional.linear", F32, EQUAL, ""),
    ("nn.functional.conv2d", F32, EQUAL, ""),
    # indexing, scatter, gather
    ("index_select", F32, EQUAL, ""),
    ("gather", F32, EQUAL, ""),
    ("scatter_add", F32, EQUAL, ""),
    ("index_put", F32, EQUAL, ""),
    ("index_add", F32, EQUAL, ""),
    ("__getitem__", F32, EQUAL, ""),
    ("masked_fill", F32, EQUAL, ""),
    ("nn.functional.embedding", F32, EQUAL, ""),
    ("nonzero", F32, NO_GRAPH, ""),
    # views, joins
    ("reshape", F32, EQUAL, ""),
    ("transpose", F32, EQUAL, ""),
    ("narrow", F32, EQUAL, ""),
    ("cat", F32, EQUAL, ""),
    ("stack", F32, EQUAL, ""),
    ("split", F32, EQUAL, ""),
    ("unsafe_split", F32, EQUAL, ""),
    # normalisations, losses
    ("softmax", F32, EQUAL, ""),
    ("log_softmax", F32, EQUAL, ""),
    ("nn.functional.layer_norm", F32, EQUAL, ""),
    ("nn.functional.rms_norm", F32, EQUAL, ""),
    ("nn.functional.group_norm", F32, EQUAL, ""),
    ("nn.functional.soft_margin_loss", F32, EQUAL, ""),
    ("nn.functional.mse_loss", F32, EQUAL, ""),
    ("nn.functional.binary_cross_entropy", F32, EQUAL, ""),
    # linear algebra
    ("linalg.inv", F32, EQUAL, ""),
    ("linalg.solve", F32, EQUAL, ""),
    ("linalg.cholesky", F32, EQUAL, ""),
    ("linalg.lu_factor", F32, EQUAL, ""),
    # between copies: the op's inputs and outputs in the replay's arena, one storage
    ("linalg.qr[intermediate]", F32, EQUAL, ""),
    ("linalg.eigh[intermediate]", F32, EQUAL, ""),
    ("sort[intermediate]", F32, EQUAL, ""),
    # random numbers: captured, each call drawing what aot_eager draws under the same seed
    ("bernoulli", F32, EQUAL, ""),
    ("nn.functional.dropout", F32, EQUAL, ""),
    ("multinomial", F32, EQUAL, ""),
    ("normal", F32, EQUAL, ""),
    ("svd_lowrank", F32, EQUAL, ""),  # random numbers, then factorisations of intermediates
    # bf16
    ("add", BF16, EQUAL, ""),
    ("mul[operator]", BF16, EQUAL, ""),
    ("softmax", BF16, EQUAL, ""),
]

REWRITTEN = {"mm", "addmm", "bmm", "matmul[operator]", "nn.functional.linear"}
"""Cases a fusion pattern may rewrite (few-row products split over the cores): within tolerance of
``aot_eager``. Every other case must be bit-identical, as a CPU replay re-runs the same kernels."""

SAMPLES = {
    "nn.functional.soft_margin_loss": 2,
    "nn.functional.mse_loss": 2,
    "nn.functional.binary_cross_entropy": 3,
}
"""Cases that need more than their first sample (its first is 0-d: no reduction to get wrong)."""

DYNAMIC = {"add", "mm", "index_select", "nn.functional.layer_norm"}
"""Cases also run with ``dynamic=True``."""


def case_params() -> list:
    params = []
    for name, dtype, cls, reason in CASES:
        for dynamic in (False, True) if dtype is F32 and name in DYNAMIC else (False,):
            label = f"{name}-{str(dtype).removeprefix('torch.')}{'-dynamic' if dynamic else ''}"
            params.append(pytest.param(name, dtype, dynamic, cls, reason, id=label))
    return params


def find_target(name: str, dtype: torch.dtype) -> Target:
    variants = ("function", "operator", "intermediate", "inplace")
    targets = [t for t in select_targets([name], dtype, variants) if t.name == name]
    assert len(targets) == 1, f"{name} at {dtype}: {len(targets)} OpInfo targets"
    return targets[0]


@pytest.mark.parametrize(("name", "dtype", "dynamic", "cls", "reason"), case_params())
def test_opinfo_op(name: str, dtype: torch.dtype, dynamic: bool, cls: str, reason: str) -> None:
    with dynamo_limits():
        target = find_target(name, dtype)
        limit = SAMPLES.get(name, 1)
        result = run_target(target, dtype, dynamic=dynamic, limit=limit, pool=8, timeout=60)
    assert result.cls == cls, f"{name}: {result.cls} ({result.reason}); samples {result.samples}"
    if cls == FALLBACK:
        assert reason in result.reason
    if cls == EQUAL:
        assert result.captures >= 1 and result.replays >= 2 * result.captures, result
        assert name in REWRITTEN or not result.inexact, f"{name}: {result.inexact}"


KERNEL_CASES = ["add", "sort[intermediate]", "index_put[inplace]"]
"""Cases run with ``static_kernel_compile=True``: each key runs Inductor's kernels for its sizes
(``make sweep`` runs the breadth subset so): a pointwise op; an op between copies (its tensors
intermediates); an op writing its input in place (the kernels' write reaches the caller's
tensor). Within tolerance of ``aot_eager`` (Inductor may fuse differently)."""


@pytest.mark.parametrize("name", KERNEL_CASES)
def test_opinfo_op_on_static_kernels(name: str) -> None:
    with dynamo_limits():
        target = find_target(name, F32)
        options = {"static_kernel_compile": True}
        result = run_target(target, F32, limit=1, pool=8, timeout=120, options=options)
    assert result.cls == EQUAL, f"{name}: {result.cls} ({result.reason}); samples {result.samples}"
    assert result.captures >= 1 and result.kernels == result.captures, result
