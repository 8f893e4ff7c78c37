"""The built-in patterns, in the order they are registered: one module each, each stating its
numeric tolerance against eager and checking what it binds before it replaces it (``checks``: a
tensor or a number, dtype, device, broadcast shape). Registered on first use
(``register_builtin_patterns``), into the pass each entry names (``registry``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from npugraph_ex.passes.patterns import (
    eager_attention,
    gqa_attention,
    mm_bias,
    onednn_linear,
    rms_norm,
    row_products,
)
from npugraph_ex.passes.patterns.registry import capture_registry, product_registry, registry

BUILTIN: tuple[tuple[Callable[[Any], None], Callable[[], Any]], ...] = (
    (eager_attention.register, registry),  # float32; half precisions: ``register_for``
    (gqa_attention.register, registry),
    (mm_bias.register, registry),
    (rms_norm.register, registry),
    (row_products.register, capture_registry),
    (onednn_linear.register, product_registry),  # the products ``row_products`` left
)
"""Each pattern module's ``register(pass)`` and the pass it registers into."""


@functools.cache
def register_builtin_patterns() -> None:
    for register, into in BUILTIN:
        register(into())


@functools.cache
def register_for(dtype: torch.dtype) -> None:
    """The built-in patterns that are traced per half-precision dtype (``HALF_PRECISION``),
    registered the first time a graph of that dtype reaches the pass: tracing them costs about
    as much as every float32 pattern together, which float32 models need not pay."""
    if dtype in eager_attention.HALF_PRECISION:
        eager_attention.register(registry(), dtype)


@functools.cache
def register_copied_operands_for(dtype: torch.dtype) -> None:
    """The attention patterns whose query, key or value a product copies first (a transposed
    batch: ``eager_attention.layouts``), registered the first time a graph of that dtype with
    such a copy reaches the pass: they are most of the attention patterns, and most graphs
    need none of them."""
    if dtype is torch.float32 or dtype in eager_attention.HALF_PRECISION:
        eager_attention.register(registry(), dtype, copied_operands=True)
