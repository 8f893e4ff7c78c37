"""What the capture manager must know about an optimised graph before its first call.

Read once per FX graph from the nodes' fake values: which inputs the graph writes, which device it
runs on, which inputs are host scalars, and whether anything in it cannot live in a device graph.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from npugraph_ex.debug.source import source_line
from npugraph_ex.passes.graph_facts import fake_value
from npugraph_ex.runtime.tensors import tensors_in
from npugraph_ex.schemas import CONTROL_FLOW, NON_BLOCKING_COPIES, argument_value

# ``dynamic_output_shape`` ops (nonzero, but also indexing with int tensors) are judged by
# their fake output instead: only an unbacked size makes the shape data-dependent.
HOST_SYNC_TAGS = (torch.Tag.data_dependent_output,)
UNSAFE_TAG = getattr(torch.Tag, "cudagraph_unsafe", None)


@dataclass(frozen=True)
class GraphFacts:
    """Facts about one optimised graph that decide how each call is keyed and captured."""

    device_type: str
    """The device the graph computes on ("cpu", "cuda", "npu")."""
    static_indices: frozenset[int]
    """Parameters and buffers: used in place, never copied."""
    mutated_indices: frozenset[int]
    """Inputs the graph writes: used in place, their addresses checked on every call."""
    host_scalar_indices: frozenset[int]
    """0-d CPU tensors feeding a device graph: their values are frozen into the capture."""
    blocker: str | None
    """Why the graph cannot be captured (op and source line), or None."""
    token_indices: frozenset[int] = frozenset()
    """Effect tokens (``with_effects`` ordering inputs): AOTAutograd passes None for them."""
    tensor_indices: frozenset[int] = frozenset()
    """Inputs that are tensors (effect tokens excluded); the others are ints and other values."""
    num_inputs: int = 0
    draws_random: bool = False
    """It has random ops (a CPU graph: a device graph refuses them)."""


def mutated_inputs(graph: torch.fx.Graph) -> frozenset[int]:
    """Indices of placeholders whose storage some op writes (views of them included).

    Inputs the caller passed as views of one tensor (``f(b[0], b[1])``) share one storage as
    traced: a write to one marks them all, so none is read from, or written to, a copy.
    """
    storage_owners: dict[StorageWeakRef, list[int]] = {}
    for index, node in enumerate(graph.find_nodes(op="placeholder")):
        value = fake_value(node)
        if isinstance(value, torch.Tensor):
            storage_owners.setdefault(StorageWeakRef(value.untyped_storage()), []).append(index)
    mutated = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for position, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = (
                node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
            )
            for written in torch.utils._pytree.tree_leaves(value):
                fake = fake_value(written) if isinstance(written, torch.fx.Node) else None
                if isinstance(fake, torch.Tensor):
                    mutated.update(storage_owners.get(StorageWeakRef(fake.untyped_storage()), ()))
    return frozenset(mutated)


def effect_tokens(graph: torch.fx.Graph) -> frozenset[int]:
    """Indices of placeholders that only order side effects (the token of ``with_effects``).

    AOTAutograd traces them as empty tensors but calls the graph with None in their place, so
    they are neither shaped nor copied inputs.
    """
    with_effects = torch.ops.higher_order.with_effects
    tokens = []
    for index, node in enumerate(graph.find_nodes(op="placeholder")):
        users = list(node.users)
        if users and all(u.target is with_effects and u.args[0] is node for u in users):
            tokens.append(index)
    return frozenset(tokens)


def graph_devices(values: Iterable[Any]) -> set[torch.device]:
    return {v.device for v in values if isinstance(v, torch.Tensor) and v.device.type != "meta"}


def is_host_scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0


def draws_random_numbers(node: torch.fx.Node) -> bool:
    """True for seeded random ops, except dropout-carrying ops that cannot drop anything."""
    target = node.target
    if not hasattr(target, "_schema") or torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    names = {argument.name for argument in node.target._schema.arguments}
    if "dropout_p" in names:
        return argument_value(node, "dropout_p", 0.0) != 0.0
    if "train" in names:
        return argument_value(node, "train") is not False
    return True


def graph_draws_random_numbers(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` or a subgraph it runs (a ``torch.cond`` branch) draws random numbers."""
    return any(
        node.op == "call_function" and draws_random_numbers(node) for node in graph.nodes
    ) or any(graph_draws_random_numbers(subgraph.graph) for subgraph in subgraphs_of(graph))


def subgraphs_of(
    graph: torch.fx.Graph, node: torch.fx.Node | None = None
) -> list[torch.fx.GraphModule]:
    """The graph modules ``graph``'s ``get_attr`` nodes (those ``node`` reads, when given) name:
    the branches of its control flow."""
    found = []
    for attr in graph.find_nodes(op="get_attr"):
        if node is not None and attr not in node.all_input_nodes:
            continue
        value: Any = graph.owning_module
        for part in attr.target.split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.fx.GraphModule):
            found.append(value)
    return found


def writes_operands(node: torch.fx.Node) -> bool:
    """Whether a control-flow node's subgraphs write a tensor they are given (a ``torch.cond``
    branch may without grad: ``x.sin_()``, which AOTAutograd leaves as a ``copy_`` into it)."""
    return any(writes_inputs(subgraph.graph) for subgraph in subgraphs_of(node.graph, node))


def writes_inputs(graph: torch.fx.Graph) -> bool:
    """Whether a kernel of ``graph`` writes one of its placeholders or a view of one; an op with
    no schema given one counts as writing it."""
    aliases = set(graph.find_nodes(op="placeholder"))
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if not any(arg in aliases for arg in node.all_input_nodes):
            continue
        schema = getattr(node.target, "_schema", None)
        if node.target is operator.getitem:
            aliases.add(node)
        elif node.target in CONTROL_FLOW:
            if writes_operands(node):
                return True
        elif schema is None:
            return True
        else:
            for position, argument in enumerate(schema.arguments):
                value = (
                    node.args[position]
                    if position < len(node.args)
                    else node.kwargs.get(argument.name)
                )
                leaves = pytree.tree_leaves(value)
                given = [v for v in leaves if isinstance(v, torch.fx.Node) and v in aliases]
                if argument.alias_info is None or not given:
                    continue
                if argument.alias_info.is_write:
                    return True
                aliases.add(node)  # a view of an input
    return False


def uncapturable_op(node: torch.fx.Node, device_type: str) -> str | None:
    """Why this node cannot be replayed from a capture on ``device_type``, or None. The CPU
    replay re-issues a random op on every replay, from the generator eager draws from."""
    target = node.target
    if node.op != "call_function" or target is operator.getitem:
        return None
    tags = getattr(target, "tags", ())
    if device_type != "cpu" and draws_random_numbers(node):
        return "random-number op"
    if target in CONTROL_FLOW and writes_operands(node):
        return "control flow whose branch writes the tensors it is given"
    if any(tag in tags for tag in HOST_SYNC_TAGS):
        return "host synchronisation (data-dependent output)"
    if UNSAFE_TAG is not None and UNSAFE_TAG in tags:
        return "op marked unsafe for device graphs"
    value = fake_value(node)
    if value is not None and torch.fx.experimental.symbolic_shapes.free_unbacked_symbols(value):
        return "data-dependent output shape"
    return None


COPY_TARGETS = frozenset(NON_BLOCKING_COPIES) | {
    torch.ops.aten._copy_from.default,
    torch.ops.prims.device_put.default,
}
"""Ops that move bytes between devices (a host-to-device copy is a memcpy, not a scalar)."""


def host_side_hazard(node: torch.fx.Node, host_scalars: Sequence[torch.fx.Node]) -> str | None:
    """Why this node's CPU tensors cannot live in a device graph, or None.

    CPU ops run while a device graph is captured and never when it replays: their results are
    constants of the capture. That is right for CPU tensors made from the key's own values (ints,
    host scalar inputs, constants), such as a 0-d tensor a kernel reads as a scalar. It is wrong
    for a copy from the device (its value is data), and a copy to the device of a tensor the graph
    made on the CPU fails while capturing (its memory is not pinned; host scalar inputs are
    staged in pinned memory, so their copies are captured).
    """
    outputs = tensors_in(fake_value(node))
    reads = {arg: tensors_in(fake_value(arg)) for arg in node.all_input_nodes}
    read = [t for values in reads.values() for t in values]
    if any(t.device.type == "cpu" for t in outputs) and any(t.device.type != "cpu" for t in read):
        return "device-to-host copy"
    if not any(t.device.type != "cpu" for t in outputs):
        return None
    cpu_sources = [a for a, values in reads.items() if any(t.device.type == "cpu" for t in values)]
    if node.target in COPY_TARGETS and any(arg not in host_scalars for arg in cpu_sources):
        return "host-to-device copy of a tensor made on the CPU inside the graph"
    if any(t.device.type == "cpu" and t.dim() > 0 for t in read):
        return "CPU tensor read by a device kernel"
    return None


def find_blocker(
    gm: torch.fx.GraphModule, device_type: str, host_scalar_indices: Sequence[int] = ()
) -> str | None:
    placeholders = gm.graph.find_nodes(op="placeholder")
    host_scalars = [placeholders[i] for i in host_scalar_indices]
    for node in gm.graph.nodes:
        reason = uncapturable_op(node, device_type)
        if reason is None and device_type != "cpu" and node.op == "call_function":
            reason = host_side_hazard(node, host_scalars)
        if reason is not None:
            return f"{reason}: {node.target} ({node.name}) at {source_line(node)}"
    return None


def input_values(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[Any]:
    """The graph's inputs: each placeholder's fake value, or its example where it has none."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    return [
        example if (value := fake_value(node)) is None else value
        for node, example in zip(placeholders, example_inputs, strict=False)
    ] or list(example_inputs)


def accelerators_of(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> list[str]:
    """The device types other than the CPU that the graph's values live on, sorted
    (``inputs``: its ``input_values``)."""
    devices = graph_devices(inputs) | graph_devices(
        fake_value(node) for node in gm.graph.nodes if node.op == "call_function"
    )
    return sorted({device.type for device in devices if device.type != "cpu"})


def graph_device_type(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """The device type the graph runs on: its accelerator's, else the CPU's."""
    accelerators = accelerators_of(gm, input_values(gm, example_inputs))
    return accelerators[0] if accelerators else "cpu"


def analyse_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], static_indices: Iterable[int]
) -> GraphFacts:
    """Read the facts the capture manager needs from an optimised ATen graph."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    values = input_values(gm, example_inputs)
    accelerators = accelerators_of(gm, values)
    device_type = accelerators[0] if accelerators else "cpu"
    blocker = None
    if len(accelerators) > 1:
        blocker = f"tensors on several device types: {', '.join(accelerators)}"
    host_scalars = frozenset()
    mutated = mutated_inputs(gm.graph)
    if device_type != "cpu":
        host_scalars = frozenset(i for i, v in enumerate(values) if is_host_scalar(v))
        for index, value in enumerate(values):
            is_cpu = isinstance(value, torch.Tensor) and value.device.type == "cpu"
            if not is_cpu or blocker is not None:
                continue
            name = placeholders[index].name
            if index in mutated:
                blocker = f"the graph writes CPU tensor input {name}, which a replay would not"
            elif index not in host_scalars:
                blocker = f"CPU tensor input {name} in a {device_type} graph"
    tokens = effect_tokens(gm.graph)
    return GraphFacts(
        device_type=device_type,
        static_indices=frozenset(static_indices),
        mutated_indices=mutated,
        host_scalar_indices=host_scalars,
        blocker=blocker or find_blocker(gm, device_type, sorted(host_scalars)),
        token_indices=tokens,
        tensor_indices=frozenset(
            i for i, v in enumerate(values) if isinstance(v, torch.Tensor) and i not in tokens
        ),
        num_inputs=len(values),
        draws_random=graph_draws_random_numbers(gm.graph),
    )
