"""Whether compiled kernels give what the ATen replay gives, within the dtype's rounding.

Inductor fuses and reorders arithmetic, so its results differ from the ATen kernels' by
rounding; a wrong kernel (a miscompile, kernels built for other sizes or weights) differs by
more. Before a key's kernels serve a call, the swap runs both forms on the same inputs and keeps
the kernels only where every output and every input the graph writes agrees, element by
element:

    |got - want| <= atol + rtol * |want| + stol * max |want|       (NaN equal to NaN)

with the tolerances of the value's dtype (``TOLERANCES``); anything else (integers, booleans)
must be equal. The last term is a few units in the last place of the value's largest element:
two computations of a deep model in half precision part by that much wherever a sum cancels
(Qwen3-0.6B's decode step in bfloat16: 0.047 in a KV cache, where ``isclose`` alone allowed
0.01 near zero), while a miscompile is off by a good part of the value's scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

TOLERANCES: dict[torch.dtype, tuple[float, float, float]] = {
    torch.float64: (1e-7, 1e-7, 0.0),
    torch.float32: (1e-3, 1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3, 4e-3),
    torch.bfloat16: (2e-2, 1e-2, 3e-2),
}
"""``(rtol, atol, stol)`` by dtype: ``rtol`` and ``atol`` ten times the rounding
``torch.testing.assert_close`` allows by default, as a model's worth of reordered sums and fused
reductions round more than one op; ``stol``, of the value's largest magnitude, about four units
in the last place of it (float16 and bfloat16)."""


@dataclass(frozen=True)
class Disagreement:
    """The value that differs most beyond its tolerance."""

    index: int
    """Its place among the values compared (outputs, then the inputs the graph writes)."""
    difference: float
    """The largest absolute difference in it."""

    def __str__(self) -> str:
        return f"largest difference {self.difference:.3g} in value {self.index}"


def disagreement(got: Sequence[Any], want: Sequence[Any]) -> Disagreement | None:
    """The value of ``got`` furthest from ``want`` beyond its tolerance, or None where all
    agree."""
    worst: Disagreement | None = None
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if not isinstance(b, torch.Tensor):
            if a != b:
                return Disagreement(index, float("inf"))
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return Disagreement(index, float("inf"))
        difference = beyond_tolerance(a, b)
        if difference is not None and (worst is None or difference > worst.difference):
            worst = Disagreement(index, difference)
    return worst


def beyond_tolerance(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """The largest absolute difference of ``a`` from ``b`` where some element lies beyond the
    tolerance of their dtype, else None."""
    if a.numel() == 0:
        return None
    rtol, atol, stol = TOLERANCES.get(b.dtype, (0.0, 0.0, 0.0))
    if b.is_complex() or b.is_floating_point():
        scale = float(b.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).max()) if stol else 0.0
        close = torch.isclose(a, b, rtol=rtol, atol=atol + stol * scale, equal_nan=True)
    else:
        close = a == b
    if bool(close.all()):
        return None
    return float((a.double() - b.double()).abs().nan_to_num(float("inf")).max())


def values_of(outputs: Sequence[Any], written: Sequence[torch.Tensor]) -> list[Any]:
    """Private copies of a call's outputs and of the inputs it wrote, to compare later."""
    return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in (*outputs, *written)]
