"""Call mutating custom ops in place again (part of ``input_inplace_pass``).

AOTAutograd wraps a custom op that mutates an input in ``auto_functionalized``: the op runs on
copies of what it mutates, and the results are copied back. Inductor's re-inplacing decides,
for each such node, which copies are needed (none, when nothing reads the old values), and its
decomposition turns the node into a direct call of the op:

    before: %af = auto_functionalized_v2(ns.op, _all_bases=[%buf]); %new = getitem(%af, 1)
            ...; aten.copy_(%buf, %new)
    after:  ns.op(%buf); ...                                   (uses of %new read %buf)

The ``copy_`` of a tensor into itself that this leaves is removed.
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten


def auto_functionalized_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    hops = {
        getattr(torch.ops.higher_order, name, None)
        for name in ("auto_functionalized", "auto_functionalized_v2")
    }
    return [node for node in graph.nodes if node.op == "call_function" and node.target in hops]


def reinplace_custom_ops(graph: torch.fx.Graph) -> int:
    """Re-inplace every ``auto_functionalized`` node it can; returns how many there were."""
    found = auto_functionalized_nodes(graph)
    if not found:
        return 0
    from torch._inductor.fx_passes.post_grad import decompose_auto_functionalized
    from torch._inductor.fx_passes.reinplace import reinplace_inplaceable_ops_core

    reinplace_inplaceable_ops_core(graph)
    decompose_auto_functionalized(graph)
    for node in list(graph.nodes):
        if node.target is aten.copy_.default and not node.users and node.args[0] is node.args[1]:
            graph.erase_node(node)
    return len(found)
