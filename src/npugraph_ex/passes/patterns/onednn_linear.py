"""A product by a weight on CPU through oneDNN's linear kernel instead of ATen's ``mm``.

ATen runs ``nn.Linear``'s product (``mm``/``addmm`` by the transposed weight) through MKL. On
hosts where MKL takes a generic code path (the AMD CPU the figures below were measured on), a
product of a few to a few hundred rows by a weight larger than the caches runs at a third to a
half of what the same cores reach on large matrices; oneDNN's inner product, which ATen ships
for its own fused CPU kernels, runs the same product from the plain weight 1.2x to 3.3x faster:

    before: %y = aten.mm(%x, aten.t(%w))             x: [M, K], w: [N, K] (nn.Linear's layout)
    after:  %y = mkldnn._linear_pointwise(%x, %w, None, "none", [], "")
    before: %y = aten.addmm(%b, %x, aten.t(%w))      b: [N]
    after:  %y = mkldnn._linear_pointwise(%x, %w, %b, "none", [], "")

No copy of the weight is made (oneDNN reads it as the model holds it, so a weight changed in
place between calls is read as it is then). ``python benchmarks/few_row_products.py --onednn``
times the tiny Qwen3's 29 products both ways at 1 to 256 rows, interleaved: 1.2x to 1.7x faster
from 4 rows on, 0.94x at one row. Timed per weight size, oneDNN's fixed cost per call (about
10 us here) makes it slower than ``mm`` on weights below ``MIN_WEIGHT_ELEMENTS``. Qwen3-0.6B's
larger weights gain 1.8x (one row) to 3.3x (``docs/notes.md``, "Products through oneDNN").

Applied to float32 CPU products whose weight is contiguous and has at least
``MIN_WEIGHT_ELEMENTS``, whose row count is symbolic or at least ``MIN_ROWS``, that the few-row
split (``row_products``, whose pass runs first) does not take, at a row count where a
measurement says oneDNN pays on this host (``host_probes.linear_pays``: once per process, at six
row counts; MKL's Intel code paths are fast at some counts and slow at others, so the answer is
per count, not per host; a symbolic count is taken where oneDNN pays at some count), and
among the first ``MAX_ROW_COUNTS`` counts the process gives oneDNN (it keeps generated code for
every shape it runs). A key of a dynamic graph at a count not taken runs the product as ``mm``
or the split (``capture/key_shapes``, through ``plain_or_split``). With
``static_kernel_compile`` this pattern does not run; each key's decomposition puts in the same
call where ``takes`` says so, and the generated code calls it (``kernels/decompositions``).

Tolerance: each output is the same dot product summed by another kernel (max |diff| 5.7e-5 on
[20, 256] x [256, 768] products of unit normal values, whose outputs are about 16 in size:
a few units in the last place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from npugraph_ex.compat import onednn_linear_op
from npugraph_ex.host_probes import linear_pays
from npugraph_ex.passes.patterns.checks import bound, bound_tensors, one_bias_per_row, one_kind

MIN_WEIGHT_ELEMENTS = 64 * 1024
"""Smallest weight (256 KiB of float32) taken. Below, oneDNN's per-call cost (about 10 us
against ``mm``'s 5 us) is not won back: the tiny Qwen3's 29 products at 4 to 35 rows ran 1.39x
to 1.75x faster than ``mm`` with weights from 64K elements on, 1.12x to 1.87x with every weight
(the k and v projections, 32K, lose), 1.13x to 1.47x from 128K."""

MIN_ROWS = 4
"""Fewest rows taken: at one row the tiny model's products run at 0.82x of ``mm``, at two at
0.97x, at four 1.39x (a one-row product is the split's, where the split pays)."""

MAX_ROW_COUNTS = 32
"""Most distinct row counts a process runs through oneDNN's linear kernel (``takes_rows``).
oneDNN generates code for every shape it runs and keeps it for the life of the process: about
0.57 MiB per weight shape and row count on the host measured, whatever the weight's size, in a
cache of 1024 shapes (some 450 MiB), so a dynamic graph called at many lengths would keep that
much. Past this many counts a product of a new count runs as ``mm`` or the split, as where oneDNN
does not pay: at most 32 x 0.57 MiB per weight shape (73 MiB for the tiny Qwen3's four), and
every length of the demo's growing loop (27 counts from 9 to 35 rows) still through oneDNN."""

ROW_COUNTS: set[int] = set()
"""The row counts given to oneDNN in this process so far."""

LINEAR = onednn_linear_op()
"""None in a torch build without oneDNN: then nothing is taken."""


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return LINEAR(x, w, b, "none", [], "")


def replace(x, w):  # noqa: ANN001, ANN201
    return linear(x, w, None)


def replace_with_bias(b, x, w):  # noqa: ANN001, ANN201
    return linear(x, w, b)


def takes(x: torch.Tensor, w: torch.Tensor, b: Any = None) -> bool:
    """A float32 CPU product of a 2-d input by a contiguous ``[N, K]`` weight of at least
    ``MIN_WEIGHT_ELEMENTS`` (and a bias of one value per weight row, if any), with a symbolic
    row count or at least ``MIN_ROWS`` rows, on a host where oneDNN pays. Sizes are compared
    only where they are plain ints (comparing a symbolic size would add a guard)."""
    rows = x.shape[0]
    return (
        x.device.type == "cpu"
        and x.dim() == 2
        and w.dim() == 2
        and one_kind([x, w], (torch.float32,))
        and (not isinstance(rows, int) or rows >= MIN_ROWS)
        and all(isinstance(size, int) for size in w.shape)
        and w.is_contiguous()
        and w.numel() >= MIN_WEIGHT_ELEMENTS
        and (b is None or one_bias_per_row(b, w))
        and LINEAR is not None
        and (takes_rows(rows) if isinstance(rows, int) else linear_pays(None))
    )


def takes_rows(rows: int) -> bool:
    """Whether a product of ``rows`` rows (a plain count) runs through oneDNN: at least
    ``MIN_ROWS``, at a count where oneDNN pays on this host, and one of the first
    ``MAX_ROW_COUNTS`` counts the process gives it."""
    if rows < MIN_ROWS or not linear_pays(rows):
        return False
    if rows not in ROW_COUNTS:
        if len(ROW_COUNTS) >= MAX_ROW_COUNTS:
            return False
        ROW_COUNTS.add(rows)
    return True


def linear_takes(match: Any) -> bool:
    tensors = bound_tensors(match, "x", "w")
    return tensors is not None and takes(*tensors)


def linear_takes_with_bias(match: Any) -> bool:
    tensors = bound_tensors(match, "x", "w")
    bias = bound(match, "b")
    return tensors is not None and isinstance(bias, torch.Tensor) and takes(*tensors, bias)


def plain_or_split(op: Any, args: tuple) -> Callable[[], torch.Tensor] | None:
    """For a call of oneDNN's linear in a key whose sizes are now known: the few-row split
    where it takes the product, else ``mm``/``addmm`` where ``takes_rows`` does not take its row
    count (what a graph compiled for these sizes runs); None to run it as it is."""
    from npugraph_ex.passes.patterns.row_products import split_of

    if LINEAR is None or op is not LINEAR or len(args) != 6:
        return None
    x, w, b = args[:3]
    plain = torch.ops.aten.mm.default if b is None else torch.ops.aten.addmm.default
    plain_args = (x, w.t()) if b is None else (b, x, w.t())
    split = split_of(plain, plain_args)
    if split is not None:
        return split
    if not takes_rows(x.shape[0]):
        return lambda: plain(*plain_args)
    return None


def register(pass_dict: Any) -> None:
    """The split's search (``row_products``), replaced by oneDNN's call; in its own pass, after
    the split's (one pass cannot hold the same search twice)."""
    from npugraph_ex.passes.patterns.row_products import register_linear_forms

    register_linear_forms(
        pass_dict, (replace, linear_takes), (replace_with_bias, linear_takes_with_bias), rows=4
    )
