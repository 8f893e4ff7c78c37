"""Replace known op patterns by fused forms (``pattern_fusion_pass``).

The patterns live in ``npugraph_ex.passes.patterns`` (built-in ones, and those users add with
``npugraph_ex.register_replacement``); see there for what each replaces and its tolerance. A view
that a replacement's output layout no longer fits reads a copy, and a value past a replacement of
another dtype or shape than traced drops the pass (``replaced_layouts``).

    before: %k4 = repeat_kv(%k); %o = sdpa(%q, %k4, %v4)
    after:  %o = sdpa(%q, %k, %v, enable_gqa)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.passes.patterns import (
    canonical_spellings,
    capture_registry,
    product_registry,
    registry,
)
from npugraph_ex.passes.patterns.builtin import (
    register_builtin_patterns,
    register_copied_operands_for,
    register_for,
)
from npugraph_ex.passes.patterns.eager_attention import copies_an_operand
from npugraph_ex.passes.replaced_layouts import layouts_kept

CAPTURE_PATTERNS = "npugraph_ex.capture_patterns"
"""``gm.meta`` key, True once the capture-only patterns ran on the graph: the keys of a graph
with symbolic row counts then get them per key (``capture/key_shapes.py``)."""


DEFER_CAPTURE_PATTERNS = "npugraph_ex.defer_capture_patterns"
"""``gm.meta`` key: this pass applies the patterns every lowering shares only, and whoever set
the key applies the capture-only ones later (``fuse_capture_patterns``): a graph lowered both for
capture and for Inductor (``static_kernel_compile="background"``) matches the shared patterns
once."""


def fuse_patterns(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config) -> None:
    register_builtin_patterns()
    canonical_spellings(gm.graph)
    copies = copies_an_operand(gm.graph)
    for dtype in input_dtypes(gm):
        register_for(dtype)
        if copies:
            register_copied_operands_for(dtype)
    with layouts_kept(gm.graph):
        replaced = registry().apply(gm.graph)
        if replaced:
            gm.graph.eliminate_dead_code()
    if not config.static_kernel_compile and not gm.meta.get(DEFER_CAPTURE_PATTERNS):
        fuse_capture_patterns(gm)


def input_dtypes(gm: torch.fx.GraphModule) -> set[torch.dtype]:
    """The dtypes of the graph's tensor inputs (parameters included)."""
    values = (node.meta.get("val") for node in gm.graph.find_nodes(op="placeholder"))
    return {value.dtype for value in values if isinstance(value, torch.Tensor)}


def fuse_capture_patterns(gm: torch.fx.GraphModule) -> None:
    """The patterns for a captured replay only (their ``out=`` and split forms are not what
    Inductor lowers)."""
    with layouts_kept(gm.graph):
        replaced = capture_registry().apply(gm.graph)
        replaced += product_registry().apply(gm.graph)
        if replaced:
            gm.graph.eliminate_dead_code()
    gm.meta[CAPTURE_PATTERNS] = True
