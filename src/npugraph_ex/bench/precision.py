"""The dtypes ``npugraph-ex bench --dtype`` runs a model in, and the agreement with eager to expect.

Eager runs in the same dtype as every variant, so the check is against the dtype's own eager
result, not against float32. What differs is the rounding: a compiled graph adds, fuses and orders
some sums differently from eager, so its logits differ from eager's by rounding of the dtype's
size. In float32 that is about 1e-6, far below the gap between the two best logits of a greedy
pick, so the tokens are equal. One rounding of float16 is 8,000 times larger and one of bfloat16
65,000 times (1e-2 on the tiny preset's logits with Inductor's kernels), enough to flip a pick
between two logits that close (a near-tie); every later step is then fed another token and
differs too. ``k/n`` tokens agreeing is then expected, not a fault, and the logit difference is
only taken up to the first differing pick (``workload.agreement``). A variant that replays
eager's own kernels (plain ``npugraph_ex``) usually matches eager bit for bit in any dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    """One ``--dtype`` choice."""

    name: str
    dtype: torch.dtype
    expect: str
    """What agreement with eager to expect in this dtype, for the report's notes."""

    @property
    def eps(self) -> float:
        """The gap between 1 and the next value of the dtype: the scale of one rounding."""
        return torch.finfo(self.dtype).eps

    def note(self) -> str:
        """One line for the report: the dtype, its rounding, what agreement to expect."""
        return f"dtype: {self.name} (eps {self.eps:.2g}), eager in the same dtype; {self.expect}"


HALF_EXPECT = (
    "greedy tokens may part from eager's after a near-tie (two logits within a few eps of "
    "their size), and every later token with them, so k/n agreeing is expected; logit diffs of a "
    "few eps times the logits' size are rounding"
)

PRECISIONS: dict[str, Precision] = {
    "float32": Precision(
        "float32",
        torch.float32,
        "tokens should equal eager's (yes); logit diffs are float32 rounding (about 1e-6)",
    ),
    "float16": Precision("float16", torch.float16, HALF_EXPECT),
    "bfloat16": Precision("bfloat16", torch.bfloat16, HALF_EXPECT),
}
"""Every ``--dtype`` by name; ``float32`` is the default."""
