"""The CPU's answers: when each rewrite of a matrix product pays, and which keys get their own.

Every decision about a product on CPU is made here, from its sizes and a measurement of the host
(``probes``): the few-row split over the intra-op threads (``split_pays``), oneDNN's linear
kernel (``onednn_linear_pays``), a static kernel's multiply-and-sum (``reduction_pays``,
``static_kernel_products``), and which keys of a graph with symbolic row counts run those
rewrites chosen for their own sizes (``key_rule``). The patterns that make the rewrites
(``passes/patterns/row_products.py``, ``onednn_linear.py``, ``kernels/decompositions.py``) check
what they bind and ask these questions; the key specialisation is ``capture/key_shapes.py``'s.

    graph:   %y = mm(%x, t(%w))       x: [1, 1024] float32, w: [4096, 1024], 2 threads
    asks:    split_pays(Product(1, 4096, 1024, float32), parts=2)
    answer:  1 <= 8 rows, 4M >= 32K weight elements, 2 blocks, the host probe says it pays: yes
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npugraph_ex.runtime.cpu import probes
from npugraph_ex.runtime.platform import ONEDNN_LINEAR, REDUCTION, KeyRule, Platform, Product

SPLIT_MIN_WEIGHT_ELEMENTS = 32 * 1024
"""Smallest weight split (128 KiB of float32). Waking the other threads costs a few microseconds,
which a small product does not win back when its weight is in the CPU caches: ``python
benchmarks/split_by_weight_size.py --evict-mb 0`` times 29 one-row products per shape, split
against ``mm``, at 0.54x-0.66x (4K elements), 0.82x-0.85x (16K), 0.78x-1.00x (32K), 1.15x-1.21x
(64K), 2.5x-4x (128K and more). Streamed from memory (the default ``--evict-mb 64``), as the
layers of a model larger than the caches are, the split wins from 16K elements on (1.6x; 1.9x-2.05x
at 32K). On whole decode steps (``--decode``): the micro Qwen3 (0.56 MB of weights, all cached)
ran at 2.01x eager with every product split, 2.06x from 32K elements (its output head only), 2.18x
with none; the tiny Qwen3 at 2.54x from 32K, 2.30x from 64K (k and v left unsplit)."""

SPLIT_MAX_ROWS = 8
"""Most rows split: ``python benchmarks/few_row_products.py --rows 1 4 8 16 32`` times the tiny
Qwen3's 29 products split against ``mm`` at 2.67x (1 row), 2.66x (4), 1.23x (8), 0.98x (16)."""

LINEAR_MIN_WEIGHT_ELEMENTS = 64 * 1024
"""Smallest weight (256 KiB of float32) given to oneDNN. Below, oneDNN's per-call cost (about
10 us against ``mm``'s 5 us) is not won back: the tiny Qwen3's 29 products at 4 to 35 rows ran
1.39x to 1.75x faster than ``mm`` with weights from 64K elements on, 1.12x to 1.87x with every
weight (the k and v projections, 32K, lose), 1.13x to 1.47x from 128K."""

LINEAR_MIN_ROWS = 4
"""Fewest rows given to oneDNN: at one row the tiny model's products run at 0.82x of ``mm``, at
two at 0.97x, at four 1.39x (a one-row product is the split's, where the split pays)."""

LINEAR_MAX_ROW_COUNTS = 32
"""Most distinct row counts a process runs through oneDNN's linear kernel
(``linear_takes_rows``). oneDNN generates code for every shape it runs and keeps it for the life
of the process: about 0.57 MiB per weight shape and row count on the host measured, whatever the
weight's size, in a cache of 1024 shapes (some 450 MiB), so a dynamic graph called at many
lengths would keep that much. Past this many counts a product of a new count runs as ``mm`` or
the split, as where oneDNN does not pay: at most 32 x 0.57 MiB per weight shape (73 MiB for the
tiny Qwen3's four), and every length of the demo's growing loop (27 counts from 9 to 35 rows)
still through oneDNN."""

LINEAR_ROW_COUNTS: set[int] = set()
"""The row counts given to oneDNN in this process so far."""

REDUCTION_MAX_ROWS = 8
"""Most rows a static kernel's product by a weight of under ``REDUCTION_LARGE_WEIGHT_ELEMENTS``
may have to become a reduction: on the reference machine the reduction is 3.8x faster than ATen's
``mm`` at one row, 2.4x at 8, 1.4x at 20 and even at 36 (``benchmarks/few_row_products.py``, the
tiny Qwen3's products), so the rule stops well inside the range where it wins."""

REDUCTION_LARGE_WEIGHT_ELEMENTS = 1024 * 1024
"""Smallest weight (4 MiB of float32, more than the CPU caches keep between calls) that becomes a
reduction at ``REDUCTION_MAX_ROWS_LARGE_WEIGHT`` rows at most. Inductor's reduction reads such a
weight from memory once per row, where the product it replaces (Inductor's ``mm``, or oneDNN's
linear from 4 rows) reads it once: ``python benchmarks/split_by_weight_size.py --reduction --rows
R --count 8 --shapes ...`` times 8 products of a weight on static kernels with and without the
reduction. With it, weights of 1M to 3M elements ran at 1.7x-2.9x the speed at 1 row, 1.8x-4.2x
at 2, 0.70x-1.07x at 4 and 0.36x-0.70x at 8; weights of 128K-512K at 1.35x-1.69x at 4 rows and
0.92x-1.41x at 8. Qwen3-0.6B's decode step at batch 8 (every weight from 1M elements): 1.96x
eager with this rule, 1.03x with every product reduced (``--decode qwen3-0.6b --reduction --batch
8``)."""

REDUCTION_MAX_ROWS_LARGE_WEIGHT = 2
"""Most rows a product by a weight of ``REDUCTION_LARGE_WEIGHT_ELEMENTS`` or more may have to
become a reduction."""

REDUCTION_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
"""Dtypes whose few-row products may become reductions (half precision summed in float32, as
ATen's kernels accumulate), each where the host's probe for it says so: the Qwen3-0.6B shapes'
one-row products on 2 threads ran 1.65x faster than ATen's ``mm`` as Inductor's reduction here in
bfloat16, 2.1x in float32, 1.0x in float16 (whose ``mm`` uses both threads; the one-thread probe
reads 1.6x, and the kernel tier's trial keeps whichever form is faster)."""

GROUPED_ROWS_MAX_POSITIONS = 8
"""Most query positions whose grouped heads run as rows of their key heads. On the CPU kernel (16
heads on 8 of 128, batch 1 and 8, 128 and 1,024 positions cached, the copies of mask and output
included) that form ran 4.1x-6.6x as fast as ``enable_gqa`` at one position in bfloat16 and
0.96x-1.66x at 2 to 8; in float32 0.98x-1.53x at one and 0.77x-1.66x at 2 to 8, the losses at
batch 1 (5 to 65 us), the wins up to 3.5 ms; from 16 on it wins or loses by a little (``python
benchmarks/one_token_attention.py --query-rows 1 2 4 8 16 32``). A whole Qwen3-0.6B step of 4 or
8 tokens over 1,024 cached positions ran 0.98x-1.16x as fast as with ``enable_gqa`` (``--decode
qwen3-0.6b --query-rows 4 8``; ``docs/notes/one-token-grouped-query-attention.md``)."""


def linear_takes_rows(rows: int) -> bool:
    """Whether a product of ``rows`` rows (a plain count) runs through oneDNN: at least
    ``LINEAR_MIN_ROWS``, at a count where oneDNN pays on this host (``probes.linear_pays``: the
    answer is per count, not per host), and one of the first ``LINEAR_MAX_ROW_COUNTS`` counts the
    process gives it."""
    if rows < LINEAR_MIN_ROWS or not probes.linear_pays(rows):
        return False
    if rows not in LINEAR_ROW_COUNTS:
        if len(LINEAR_ROW_COUNTS) >= LINEAR_MAX_ROW_COUNTS:
            return False
        LINEAR_ROW_COUNTS.add(rows)
    return True


def reduction_max_rows(weight_elements: int) -> int:
    """Most rows a static kernel's product by a weight of this size may have to become a
    reduction: ``REDUCTION_MAX_ROWS``, or ``REDUCTION_MAX_ROWS_LARGE_WEIGHT`` for a weight of
    ``REDUCTION_LARGE_WEIGHT_ELEMENTS`` or more."""
    if weight_elements >= REDUCTION_LARGE_WEIGHT_ELEMENTS:
        return REDUCTION_MAX_ROWS_LARGE_WEIGHT
    return REDUCTION_MAX_ROWS


def wants_own_kernels(counts: Sequence[int | None], onednn: bool = True) -> bool:
    """Whether a key with products of these row counts runs them as chosen for its sizes: one
    has at most ``SPLIT_MAX_ROWS`` rows, or, where the graph runs products through oneDNN's
    linear (``onednn``: it takes symbolic counts where it pays at some count; True where not
    known), oneDNN does not take its count here. A graph of plain products has nothing to run
    otherwise at a count oneDNN is not given."""
    onednn_in_use = onednn and probes.linear_pays(None)
    return any(
        count is not None
        and (count <= SPLIT_MAX_ROWS or (onednn_in_use and not linear_takes_rows(count)))
        for count in counts
    )


class CpuPlatform(Platform):
    """Products split, through oneDNN or reduced where the host measures that they pay; attention
    fused by ``scaled_dot_product_attention``; few-row keys of dynamic graphs get their own."""

    device_type = "cpu"
    dispatch_key = "CPU"

    def kernel_tier(self) -> bool | str:
        # Tiered kernels: the tiny Qwen3's one-token forward 5.06x eager against the ATen
        # replay's 2.92x, first call 6.5 s against 4.6 s (docs/benchmarks.md, "The kernel tier").
        return "background"

    def host_decisions(self) -> dict[str, Any]:
        return probes.decisions()

    def measured_answers(self) -> dict[Any, Any]:
        return probes.answers()

    def take_measured_answers(self, answers: dict[Any, Any]) -> None:
        probes.take_answers(answers)

    def split_pays(self, product: Product, parts: int) -> bool:
        """A float32 product of 1 to ``SPLIT_MAX_ROWS`` rows (a plain count) by a weight of at
        least ``SPLIT_MIN_WEIGHT_ELEMENTS``, cut into at least two blocks, on a host where the
        split pays (``probes.split_pays``)."""
        return (
            product.dtype == torch.float32
            and product.rows is not None
            and 1 <= product.rows <= SPLIT_MAX_ROWS
            and product.weight_elements >= SPLIT_MIN_WEIGHT_ELEMENTS
            and parts > 1
            and probes.split_pays()
        )

    def onednn_linear_pays(self, product: Product) -> bool:
        """A float32 product by a weight of at least ``LINEAR_MIN_WEIGHT_ELEMENTS``, whose row
        count oneDNN takes (``linear_takes_rows``), or is symbolic where oneDNN pays at some
        count. ATen runs bfloat16 products through oneDNN already: its linear kernel on the
        plain weight ran 0.96x to 1.12x as fast (``docs/notes/products-through-onednn.md``);
        float16 is not measured."""
        if product.dtype != torch.float32:
            return False
        if product.weight_elements < LINEAR_MIN_WEIGHT_ELEMENTS:
            return False
        if product.rows is None:
            return probes.linear_pays(None)
        return linear_takes_rows(product.rows)

    def reduction_pays(self, product: Product) -> bool:
        """1 to ``reduction_max_rows`` rows (fewer for a large weight) of one of
        ``REDUCTION_DTYPES``, on a host where a measurement says the reduction pays for that
        dtype (``probes.reduction_pays``)."""
        return (
            product.rows is not None
            and 1 <= product.rows <= reduction_max_rows(product.weight_elements)
            and product.dtype in REDUCTION_DTYPES
            and probes.reduction_pays(product.dtype)
        )

    def static_kernel_products(self) -> tuple[str, ...]:
        """Few rows as reductions where they pay (``reduction_pays``), then products by a
        weight through oneDNN."""
        return (REDUCTION, ONEDNN_LINEAR)

    def grouped_rows_max_positions(self) -> int:
        return GROUPED_ROWS_MAX_POSITIONS

    def cpp_wrapper(self) -> bool:
        return True

    def fused_kernels(self) -> frozenset[str]:
        """``SDPA``; not ``_fused_rms_norm``, which is the same six kernels behind one name on
        CPU, unless the installed PyTorch has a CPU kernel of its own."""
        return self.kernels_present()

    def key_rule(self) -> KeyRule | None:
        return wants_own_kernels
