"""Replace known op patterns by fused forms (``pattern_fusion_pass``).

The patterns live in ``npugraph_ex.passes.patterns`` (built-in ones, and those users add with
``npugraph_ex.register_replacement``); see there for what each replaces and its tolerance.

    before: %k4 = repeat_kv(%k); %o = sdpa(%q, %k4, %v4)
    after:  %o = sdpa(%q, %k, %v, enable_gqa)

Graphs with dynamic shapes (``dynamic=True``) are left alone for now: a match is re-traced
with its own shapes, and with symbolic ones Inductor's matcher also makes float arguments such as
an attention scale symbolic, which the fused kernels cannot take.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.debug.once import log_once
from npugraph_ex.passes.graph_facts import fake_value
from npugraph_ex.passes.patterns import canonical_views, register_builtin_patterns, registry

log = logging.getLogger(__name__)


def has_symbolic_shapes(graph: torch.fx.Graph) -> bool:
    for node in graph.find_nodes(op="placeholder"):
        value = fake_value(node)
        if isinstance(value, torch.SymInt) or (
            isinstance(value, torch.Tensor) and not all(isinstance(n, int) for n in value.shape)
        ):
            return True
    return False


def fuse_patterns(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config) -> None:
    # Matches are re-traced with their own shapes; with symbolic ones, Inductor's matcher makes
    # float arguments (an attention scale) symbolic too, which the fused kernels cannot take.
    if has_symbolic_shapes(gm.graph):
        log_once(
            log,
            logging.INFO,
            ("patterns skipped", "dynamic"),
            "npugraph_ex: pattern_fusion_pass skips graphs with dynamic shapes",
        )
        return
    register_builtin_patterns()
    canonical_views(gm.graph)
    if registry().apply(gm.graph):
        gm.graph.eliminate_dead_code()
