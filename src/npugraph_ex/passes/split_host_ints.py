"""Int inputs that are data, not sizes: fed to the capture as 0-d tensors, not baked into it.

A Python int the model changes on every call (a token count in transformers' sliding-window
``StaticCache`` layers) reaches the AOT graph as a SymInt input. Where that int only enters
arithmetic (``s - 31``, ``max(s - 31, 0)``), tensor operands (``arange(n) + s``) and int
outputs, and sizes no tensor, its value changes no shape, yet a capture would bake it into its
kernels and need a graph key per value: a capture on every call.

So, as the last pass before capture, such ints leave the device graph:

    before: %s: SymInt input;  %t = aten.add_.Tensor(%arange, %s);  return (%y, %s + 1)
    after:  %s_t: 0-d int64 tensor input;  %t = aten.add_.Tensor(%arange, %s_t);  return (%y,)

and the call around the capture manager computes, per call on the host, the ints' arithmetic,
passes each tensor operand as a 0-d tensor (copied into the capture like any input) and puts the
int outputs back in place. The graph key no longer holds the int; every value replays one
capture. Eligible: a SymInt input whose symbol sizes no tensor of the graph, whose uses (and those
of its arithmetic) are host arithmetic, graph outputs, or ``Tensor`` arguments of ATen ops whose
other tensor arguments have a dimension (where a 0-d int64 tensor promotes exactly as the int
does). Any other use (a ``Scalar`` or ``int[]`` argument such as ``roll``'s shifts) leaves the
int baked and keyed, as before.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_symbols

from npugraph_ex.config import Config
from npugraph_ex.passes.graph_facts import fake_value
from npugraph_ex.schemas import argument_value

HOST_ARITHMETIC = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.mod,
        operator.neg,
        torch.sym_max,
        torch.sym_min,
    }
)
"""Int arithmetic Dynamo records on SymInts, computed on the host per call."""


def is_symint(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and isinstance(fake_value(node), torch.SymInt)


def sized_symbols(graph: torch.fx.Graph) -> set[Any]:
    """Symbols in the size, stride or offset of any tensor of the graph."""
    symbols: set[Any] = set()
    for node in graph.nodes:
        for value in torch.utils._pytree.tree_leaves(fake_value(node)):
            if isinstance(value, torch.Tensor):
                symbols |= free_symbols(value)
    return symbols


def tensor_operand(user: torch.fx.Node, node: torch.fx.Node) -> bool:
    """``node`` is passed to ``user``, an ATen op, only where its schema takes a ``Tensor``, and
    every other tensor ``user`` takes has a dimension (so a 0-d tensor promotes as an int does)."""
    schema = getattr(user.target, "_schema", None)
    if user.op != "call_function" or schema is None:
        return False
    found = False
    for argument in schema.arguments:
        value = argument_value(user, argument.name)
        if value is node:
            if str(argument.type) != "Tensor":
                return False
            found = True
        elif isinstance(value, (list, tuple)) and node in value:
            return False  # in a list of tensors or ints: not a lone operand
        elif isinstance(value, torch.fx.Node):
            other = fake_value(value)
            if isinstance(other, torch.Tensor) and other.dim() == 0:
                return False
    return found


@dataclass(frozen=True)
class HostValue:
    """An argument of host arithmetic that is another host value: the node of that name."""

    name: str


@dataclass
class HostInts:
    """The host side of a graph whose data ints were taken out (see the module docstring).

    Plain data (node names, ``operator`` and ``torch.sym_*`` functions, devices): the compile
    cache stores it with the graph.
    """

    kept: tuple[int, ...]
    """Positions of the call's arguments the device graph still takes, in its input order."""
    order: tuple[tuple[str, Any, tuple[Any, ...]], ...]
    """Host values (inputs, and arithmetic with its target and arguments) by node name, in the
    order they compute; an input's target is None."""
    positions: dict[str, int]
    """Each removed input's position in the call's arguments."""
    operands: tuple[tuple[str, torch.device], ...]
    """Host values passed to the device graph as 0-d int64 tensors, appended to its inputs."""
    outputs: tuple[tuple[int, str], ...]
    """Output positions the host fills, each with a host value."""

    def values(self, args: Sequence[Any]) -> dict[str, int]:
        env: dict[str, int] = {}
        for name, target, target_args in self.order:
            if target is None:
                env[name] = args[self.positions[name]]
            else:
                env[name] = target(
                    *[env[a.name] if isinstance(a, HostValue) else a for a in target_args]
                )
        return env

    def device_args(self, args: Sequence[Any], env: dict[str, int]) -> list[Any]:
        kept = [args[i] for i in self.kept]
        kept += [
            torch.full((), env[name], dtype=torch.int64, device=device)
            for name, device in self.operands
        ]
        return kept

    def merge(self, outputs: list[Any], env: dict[str, int]) -> list[Any]:
        merged = list(outputs)
        for position, name in self.outputs:  # ascending: each lands where the graph had it
            merged.insert(position, env[name])
        return merged

    def wrap(self, call: Callable[[list[Any]], list[Any]]) -> Callable[[list[Any]], list[Any]]:
        def run(args: list[Any]) -> list[Any]:
            env = self.values(args)
            return self.merge(call(self.device_args(args, env)), env)

        return run

    def example_inputs(self, example_inputs: Sequence[Any]) -> list[Any]:
        """The device graph's example inputs: the kept ones, then None for each operand (its
        placeholder carries its fake value)."""
        return [example_inputs[i] for i in self.kept] + [None] * len(self.operands)

    def kept_indices(self, indices: Sequence[int]) -> list[int]:
        """Where the call's inputs at ``indices`` sit among the device graph's inputs (those it
        still takes)."""
        position = {index: new for new, index in enumerate(self.kept)}
        return [position[i] for i in indices if i in position]

    @property
    def call_inputs(self) -> int:
        """How many arguments the call takes."""
        return len(self.kept) + len(self.positions)


def eligible_inputs(graph: torch.fx.Graph) -> dict[torch.fx.Node, set[torch.fx.Node]]:
    """SymInt inputs that are data, each with its host arithmetic nodes."""
    sized = sized_symbols(graph)
    output = graph.output_node()
    found: dict[torch.fx.Node, set[torch.fx.Node]] = {}
    for placeholder in graph.find_nodes(op="placeholder"):
        value = fake_value(placeholder)
        if not isinstance(value, torch.SymInt) or free_symbols(value) & sized:
            continue
        closure = host_closure(placeholder, output)
        if closure is not None:
            found[placeholder] = closure
    # Arithmetic that mixes an eligible input with another input must stay on the device.
    host = set(found)
    for closure in found.values():
        host |= closure
    for placeholder, closure in list(found.items()):
        if any(not all(a in host for a in n.all_input_nodes) for n in closure):
            del found[placeholder]
    return found


def host_closure(placeholder: torch.fx.Node, output: torch.fx.Node) -> set[torch.fx.Node] | None:
    """The arithmetic nodes computed from ``placeholder``, or None when a use keeps it baked."""
    closure: set[torch.fx.Node] = set()
    pending = [placeholder]
    while pending:
        node = pending.pop()
        for user in node.users:
            if user is output or tensor_operand(user, node):
                continue
            arithmetic = user.op == "call_function" and user.target in HOST_ARITHMETIC
            if arithmetic and is_symint(user) and not user.kwargs:
                if user not in closure:
                    closure.add(user)
                    pending.append(user)
                continue
            return None
    return closure


def split_host_ints(gm: torch.fx.GraphModule) -> HostInts | None:
    """Take the data ints out of ``gm`` (in place); None when it has none."""
    graph = gm.graph
    found = eligible_inputs(graph)
    if not found:
        return None
    placeholders = graph.find_nodes(op="placeholder")
    positions = {node.name: placeholders.index(node) for node in found}
    host = set(found).union(*found.values())
    host_nodes = [node for node in graph.nodes if node in host]
    order = tuple(host_step(node) for node in host_nodes)
    operands = tensor_operands(graph, host, placeholders)
    output = graph.output_node()
    results = list(output.args[0])
    host_outputs = tuple(
        (position, result.name)
        for position, result in enumerate(results)
        if isinstance(result, torch.fx.Node) and result in host
    )
    output.args = (tuple(r for r in results if not (isinstance(r, torch.fx.Node) and r in host)),)
    for node in reversed(host_nodes):
        graph.erase_node(node)
    gm.recompile()
    return HostInts(
        kept=tuple(i for i in range(len(placeholders)) if i not in positions.values()),
        order=order,
        positions=positions,
        operands=operands,
        outputs=host_outputs,
    )


def host_step(node: torch.fx.Node) -> tuple[str, Any, tuple[Any, ...]]:
    """One entry of ``HostInts.order`` for a host node."""
    if node.op == "placeholder":
        return (node.name, None, ())
    return (node.name, node.target, torch.fx.node.map_arg(node.args, lambda a: HostValue(a.name)))


def tensor_operands(
    graph: torch.fx.Graph, host: set[torch.fx.Node], placeholders: list[torch.fx.Node]
) -> tuple[tuple[str, torch.device], ...]:
    """Replace every host node used as a tensor operand by a new 0-d int64 input on the device
    of its user's tensors (with its fake value). The (node name, device) pairs in the order of
    the new inputs."""
    fake_mode = torch._guards.detect_fake_mode([fake_value(n) for n in placeholders])
    last_input = placeholders[-1]
    made: dict[tuple[torch.fx.Node, torch.device], torch.fx.Node] = {}
    for node in [n for n in graph.nodes if n in host]:
        for user in list(node.users):
            if user.op != "call_function" or user.target in HOST_ARITHMETIC:
                continue
            device = user_device(user)
            key = (node, device)
            if key not in made:
                with graph.inserting_after(last_input):
                    replacement = graph.placeholder(f"{node.name}_tensor")
                replacement.meta["val"] = zero_dim_int(fake_mode, device)
                made[key] = last_input = replacement
            user.replace_input_with(node, made[key])
    return tuple((node.name, device) for node, device in made)


def zero_dim_int(fake_mode: Any, device: torch.device) -> torch.Tensor:
    """A fake (or, without a fake mode, meta) 0-d int64 tensor on ``device``."""
    if fake_mode is None:
        return torch.empty((), dtype=torch.int64, device="meta")
    with fake_mode:
        return torch.empty((), dtype=torch.int64, device=device)


def user_device(user: torch.fx.Node) -> torch.device:
    """The device of the tensors an op node reads."""
    for node in user.all_input_nodes:
        value = fake_value(node)
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


HOST_INTS = "npugraph_ex.host_ints"
"""Where the pass leaves its ``HostInts`` on the graph module's ``meta``, for the compiler to
wrap the capture manager with."""


def split_host_ints_pass(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> None:
    """The pass form of ``split_host_ints``: its result goes to ``gm.meta[HOST_INTS]``."""
    host = split_host_ints(gm)
    if host is not None:
        gm.meta[HOST_INTS] = host
