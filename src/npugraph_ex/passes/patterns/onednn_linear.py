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
10 us here) makes it slower than ``mm`` on small weights. Qwen3-0.6B's larger weights gain 1.8x
(one row) to 3.3x (``docs/notes/products-through-onednn.md``).

Applied to 2-d products whose weight is contiguous and of constant size, that the few-row split
(``row_products``, whose pass runs first) does not take, where the platform of their device says
oneDNN pays (``Platform.onednn_linear_pays``). The CPU answers in ``runtime/cpu/platform.py``:
float32, a weight large enough, a row count that is symbolic or not too small, at which a
measurement says oneDNN pays on this host (``runtime/cpu/probes.py``: once per process, at six
row counts; MKL's Intel code paths are fast at some counts and slow at others, so the answer is
per count, not per host; a symbolic count is taken where oneDNN pays at some count), among the
first counts the process gives oneDNN (it keeps generated code for every shape it runs). A key
of a dynamic graph at a count not taken runs the product as ``mm`` or the split
(``capture/key_shapes``, through ``plain_or_split``). With ``static_kernel_compile`` this pattern
does not run; each key's decomposition puts in the same call where ``takes`` says so, and the
generated code calls it (``kernels/decompositions``).

Tolerance: each output is the same dot product summed by another kernel (max |diff| 5.7e-5 on
[20, 256] x [256, 768] products of unit normal values, whose outputs are about 16 in size:
a few units in the last place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from npugraph_ex.compat import onednn_linear_op
from npugraph_ex.passes.patterns.checks import bound, bound_tensors, one_bias_per_row, one_kind
from npugraph_ex.passes.patterns.row_products import register_linear_forms
from npugraph_ex.runtime.platform import Product, platform_for

LINEAR = onednn_linear_op()
"""None in a torch build without oneDNN: then nothing is taken."""


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return LINEAR(x, w, b, "none", [], "")


def replace(x, w):  # noqa: ANN001, ANN201
    return linear(x, w, None)


def replace_with_bias(b, x, w):  # noqa: ANN001, ANN201
    return linear(x, w, b)


def takes(x: torch.Tensor, w: torch.Tensor, b: Any = None) -> bool:
    """A product of a 2-d input by a contiguous ``[N, K]`` weight of constant size, both of one
    dtype and device (and a bias of one value per weight row, if any), where the platform of
    their device says oneDNN pays (``Platform.onednn_linear_pays``). Sizes are compared only
    where they are plain ints (comparing a symbolic size would add a guard)."""
    return (
        x.dim() == 2
        and w.dim() == 2
        and one_kind([x, w], None)
        and all(isinstance(size, int) for size in w.shape)
        and w.is_contiguous()
        and (b is None or one_bias_per_row(b, w))
        and LINEAR is not None
        and platform_for(x.device.type).onednn_linear_pays(product_of(x, w))
    )


def product_of(x: torch.Tensor, w: torch.Tensor) -> Product:
    """``x @ w.t()`` as the platform's questions take it (a symbolic row count as None)."""
    rows = x.shape[0]
    return Product(rows if isinstance(rows, int) else None, w.shape[0], w.shape[1], x.dtype)


def linear_takes(match: Any) -> bool:
    tensors = bound_tensors(match, "x", "w")
    return tensors is not None and takes(*tensors)


def linear_takes_with_bias(match: Any) -> bool:
    tensors = bound_tensors(match, "x", "w")
    bias = bound(match, "b")
    return tensors is not None and isinstance(bias, torch.Tensor) and takes(*tensors, bias)


def plain_or_split(op: Any, args: tuple) -> Callable[[], torch.Tensor] | None:
    """For a call of oneDNN's linear in a key whose sizes are now known: the few-row split
    where it takes the product, else ``mm``/``addmm`` where the platform does not give oneDNN
    its row count (what a graph compiled for these sizes runs); None to run it as it is."""
    from npugraph_ex.passes.patterns.row_products import split_of

    if LINEAR is None or op is not LINEAR or len(args) != 6:
        return None
    x, w, b = args[:3]
    plain = torch.ops.aten.mm.default if b is None else torch.ops.aten.addmm.default
    plain_args = (x, w.t()) if b is None else (b, x, w.t())
    split = split_of(plain, plain_args)
    if split is not None:
        return split
    if not platform_for(x.device.type).onednn_linear_pays(product_of(x, w)):
        return lambda: plain(*plain_args)
    return None


def register(pass_dict: Any) -> None:
    """The split's search (``row_products``), replaced by oneDNN's call; in its own pass, after
    the split's (one pass cannot hold the same search twice)."""
    register_linear_forms(
        pass_dict, (replace, linear_takes), (replace_with_bias, linear_takes_with_bias), rows=4
    )
