"""Copies of host scalar inputs to the device, made capturable.

A host scalar input is a 0-d tensor on the host that a graph computing on a device reads. A
blocking copy of it synchronises the stream, which a capture forbids (the capture is invalidated).
The capture stages these inputs in pinned memory (``capture/inputs.py``), from which a
non-blocking copy is a plain memcpy that a capture records; the staged value never changes (it is
the key's), so nothing can overwrite it while a copy is in flight.

    before: %d = aten._to_copy.default(%host, device=cuda)
    after:  %d = aten._to_copy.default(%host, device=cuda, non_blocking=True)

A graph that computes on the host only is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.passes.graph_facts import fake_value
from npugraph_ex.schemas import NON_BLOCKING_COPIES


def on_a_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta")


def is_host_scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0


def host_scalar_inputs(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> set[torch.fx.Node]:
    """The placeholders that are host scalars, where the graph computes on a device; none else."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    values = {
        node: example if (value := fake_value(node)) is None else value
        for node, example in zip(placeholders, example_inputs, strict=False)
    }
    computed = (fake_value(node) for node in gm.graph.nodes if node.op == "call_function")
    if not any(on_a_device(v) for v in values.values()) and not any(map(on_a_device, computed)):
        return set()
    return {node for node, value in values.items() if is_host_scalar(value)}


def unblock_host_copies(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> None:
    hosts = host_scalar_inputs(gm, example_inputs)
    if not hosts:
        return
    for node in gm.graph.nodes:
        position = NON_BLOCKING_COPIES.get(node.target)
        if position is None or len(node.args) <= position or node.args[position] not in hosts:
            continue
        if not node.kwargs.get("non_blocking", False):
            node.update_kwarg("non_blocking", True)
