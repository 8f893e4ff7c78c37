"""Copies of host scalar inputs to the device, made capturable.

A blocking copy from the host synchronises its stream, which a capture forbids (the capture is
invalidated). Host scalar inputs are staged in pinned memory (``inputs.pinned_copy``), from which
a non-blocking copy is a plain memcpy that a capture records; the staged value never changes (it
is the key's), so nothing can overwrite it while a copy is in flight.
"""

from __future__ import annotations

import torch
import torch.fx

from npugraph_ex.capture.analysis import NON_BLOCKING_COPIES, GraphFacts


def copy_host_scalars_without_blocking(gm: torch.fx.GraphModule, facts: GraphFacts) -> int:
    """Make every copy of a host scalar input in a device graph non-blocking; how many."""
    if facts.device_type == "cpu" or not facts.host_scalar_indices:
        return 0
    placeholders = gm.graph.find_nodes(op="placeholder")
    hosts = {placeholders[i] for i in facts.host_scalar_indices}
    changed = 0
    for node in gm.graph.nodes:
        position = NON_BLOCKING_COPIES.get(node.target)
        if position is None or len(node.args) <= position or node.args[position] not in hosts:
            continue
        if not node.kwargs.get("non_blocking", False):
            node.update_kwarg("non_blocking", True)
            changed += 1
    if changed:
        gm.recompile()
    return changed
