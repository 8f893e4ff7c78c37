"""RMSNorm written out, as Hugging Face models write it, as one fused kernel where one exists.

    before: %h = _to_copy(%x, float32)                       (absent for float32 inputs)
            %y = mul(%w, _to_copy(mul(%h, rsqrt(add(mean(pow(%h, 2), [-1], True), eps))), %x.dtype))
    after:  %y = _fused_rms_norm(%x, [%x.shape[-1]], %w, eps)[0]

Six to eight kernels become one, and no float32 copy of the activations is made. Matched with the
weight on either side of the last product, for float32, bfloat16 and float16 inputs. Refused
where the kernel would compute something else: a weight that is a number, of another dtype or
device, or that broadcasts over more than the last dim; an eps that is not a number; a
half-precision norm written without the float32 casts.

Applied only where the platform of the graph's device lists the fused kernel
(``Platform.fused_kernels``: CUDA's and the NPU's where the installed PyTorch has a kernel of it
for the device; on CPU, ``_fused_rms_norm`` is the same six kernels behind one name, so the graph
is left as is).

Tolerance: float32, within 1e-6 relative (the kernel sums the squares in another order);
bfloat16/float16, within one unit in the last place of the output, because the kernel rounds
once where the written-out form rounds the normalised value and then the product with the weight.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from npugraph_ex.passes.patterns.checks import bound_tensors, is_number, one_kind, same_shape
from npugraph_ex.passes.patterns.registry import add_replacement
from npugraph_ex.runtime.platform import FUSED_RMS_NORM, platform_for

EPS = 1e-6
LOW_PRECISION = (torch.bfloat16, torch.float16)


def normalised(h, eps):  # noqa: ANN001, ANN201
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def weight_first(x, w, eps):  # noqa: ANN001, ANN201
    return w * normalised(x.to(torch.float32), eps).to(x.dtype)


def weight_last(x, w, eps):  # noqa: ANN001, ANN201
    return normalised(x.to(torch.float32), eps).to(x.dtype) * w


def fused(x, w, eps):  # noqa: ANN001, ANN201
    return torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], w, eps)[0]


def has_fused_kernel(device: torch.device) -> bool:
    """Whether ``_fused_rms_norm`` runs as one kernel on ``device``, as its platform says."""
    return FUSED_RMS_NORM in platform_for(device.type).fused_kernels()


def fusable(match: Any, traced: torch.dtype = torch.float32) -> bool:
    """A fused kernel exists for the input's device, and it computes what the graph does: a
    tensor weight of the normalised size and the input's dtype and device, a number for eps,
    and the input of the dtype the pattern was traced with (``traced``): a float32 pattern has
    no casts, so it would also match a float16 norm computed in float16, which the kernel
    computes in float32 (a float64 norm never matches: the re-trace holds the casts)."""
    tensors = bound_tensors(match, "x", "w")
    if tensors is None:
        return False
    x, w = tensors
    # Absent: the graph holds eps as a number other than the traced example, which some releases'
    # re-check (torch 2.11) matches as a literal instead of naming it.
    eps = match.kwargs.get("eps", EPS)
    return (
        is_number(eps)
        and one_kind([x, w], (traced,))
        and w.dim() == 1
        and same_shape(w.shape, x.shape[-1:])
        and has_fused_kernel(x.device)
    )


def register(pass_dict: Any) -> None:
    for dtype in (torch.float32, *LOW_PRECISION):
        x, w = torch.randn(2, 8, dtype=dtype), torch.randn(8, dtype=dtype)
        for search in (weight_first, weight_last):
            add_replacement(
                pass_dict,
                search,
                fused,
                [x, w, EPS],
                extra_check=functools.partial(fusable, traced=dtype),
                scalar_workaround={"eps": EPS},
            )
