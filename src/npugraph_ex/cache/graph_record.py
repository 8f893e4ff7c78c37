"""What the cache keeps of one compiled graph, and how it is made from a live compile.

A Dynamo graph reaches the backend as flat inputs (tensors and ints, parameters included);
AOTAutograd turns it into an ATen graph and wraps that graph in a runtime that takes and returns
the Dynamo graph's values. The record keeps:

- the ATen graph after every pass, pickled without fake values (nothing that builds a capture
  manager from it reads them), with the facts read from them (``GraphFacts``) and the plan of
  the ints computed on the host (``HostInts``);
- how AOTAutograd's runtime maps the ATen graph's outputs back (effect tokens first; an output
  that *is* an input, or a view of one, is rebuilt from that input), from its metadata. Graphs
  whose runtime does more (mutations applied outside the graph, views of intermediates, deduped
  or aliased inputs, tensor subclasses) are not recorded: ``reason`` says why;
- the shape guards over the Dynamo graph's inputs, as Python clauses (``L['t3'].size()[1] ==
  L['t0']``), and each input's kind, dtype and device: the checks Dynamo's guards made on them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from npugraph_ex.capture.analysis import GraphFacts
from npugraph_ex.capture.key_shapes import RowPlan
from npugraph_ex.compiler import LoweredGraph
from npugraph_ex.kernels.graph_bytes import pickle_graph
from npugraph_ex.passes.split_host_ints import HostInts

INPUT_NAME = re.compile(r"L\['t(\d+)'\]")


@dataclass
class GraphRecord:
    """One compiled graph as the cache stores it (plain data: bytes, strings, tuples)."""

    name: str
    graph: bytes
    """The lowered ATen graph, pickled by ``torch.fx._graph_pickler.GraphPickler``."""
    original: bytes | None
    facts: GraphFacts
    host: HostInts | None
    failed_passes: list[str]
    num_tokens: int
    outputs: list[tuple[Any, ...]]
    """Per user output: ``("graph", i)`` the graph's i-th output, ``("input", j)`` the j-th
    input itself, ``("view", i, j)`` a view of the j-th input with the i-th output's layout."""
    inputs: list[tuple[Any, ...]]
    """Per Dynamo input: ``("int",)``, ``("tensor", dtype, device, requires_grad)`` or
    ``("other", type name)``."""
    mutated: list[int]
    """Inputs the graph writes in place: none of them may share memory with another input."""
    guards: list[str] = field(default_factory=list)
    nodes: int = 0
    input_names: list[str] = field(default_factory=list)
    """Where Dynamo took each input from (``L['x']``, ``L['x'].size()[0]``), for messages."""
    rows: RowPlan | None = None
    """Where the graph's products' symbolic row counts come from (read from the fake values
    the stored graph no longer has)."""
    symbolic: list[tuple[Any, ...]] | None = None
    """Its inputs' symbolic sizes (``LoweredGraph.symbolic``), read from those values too."""
    kernels_graph: bytes | None = None
    """The graph lowered for background kernels (``LoweredGraph.kernels_gm``), pickled."""


class GraphRecorder:
    """Collects a :class:`GraphRecord` from a backend call, in three steps: made when the
    backend receives Dynamo's graph; ``lowered`` when the compiler has the lowered ATen graph
    and its callable (kept as ``call``, for this process to reuse); ``finish`` once Dynamo is
    done (shape guards may be added up to the end of the compile).
    """

    def __init__(self, gm: torch.fx.GraphModule):
        context = torch._guards.TracingContext.try_get()
        self.fake_mode = context.fake_mode if context is not None else None
        placeholders = gm.graph.find_nodes(op="placeholder")
        self.placeholders = [node.meta.get("example_value") for node in placeholders]
        self.input_names = [input_name(node) for node in placeholders]
        self.traced_files = sorted(
            {code.co_filename for code in getattr(context, "traced_code", None) or ()}
        )
        self.record: GraphRecord | None = None
        self.call: Callable[[list[Any]], Any] | None = None
        self.reason: str | None = None
        if any(v is None for v in self.placeholders):
            self.reason = "a graph input has no example value"
        elif any(is_subclass(v) for v in self.placeholders):
            self.reason = "a graph input is a tensor subclass"

    def lowered(self, lowered: LoweredGraph, call: Callable[[list[Any]], Any]) -> None:
        if self.reason is not None:
            return
        self.call = call
        context = torch._guards.TracingContext.try_get()
        metadata = getattr(context, "fw_metadata", None)
        self.reason = unsupported_runtime(metadata, lowered, len(self.placeholders))
        if self.reason is not None:
            return
        self.record = GraphRecord(
            name=lowered.name,
            graph=pickle_graph(lowered.gm),
            original=pickle_graph(lowered.original) if lowered.original is not None else None,
            facts=lowered.facts,
            host=lowered.host,
            failed_passes=list(lowered.failed_passes),
            num_tokens=len(metadata.tokens),
            outputs=output_plan(metadata),
            inputs=[input_kind(v) for v in self.placeholders],
            mutated=[i for i, info in enumerate(metadata.input_info) if info.mutates_data],
            nodes=len(lowered.gm.graph.nodes),
            input_names=self.input_names,
            rows=lowered.rows,
            symbolic=lowered.symbolic,
            kernels_graph=(
                pickle_graph(lowered.kernels_gm) if lowered.kernels_gm is not None else None
            ),
        )

    def finish(self) -> GraphRecord | None:
        """The record with its shape guards, or None (see ``reason``)."""
        if self.record is not None and not self.record.guards:
            self.record.guards = shape_guards(self.fake_mode, self.placeholders)
        self.placeholders = []
        self.fake_mode = None
        return self.record


def unsupported_runtime(metadata: Any, lowered: LoweredGraph, num_inputs: int) -> str | None:
    """Why AOTAutograd's runtime around this graph is more than the cache rebuilds, or None."""
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType

    if metadata is None:
        return "no AOTAutograd metadata"
    if lowered.call_inputs != num_inputs + len(metadata.tokens):
        return "AOTAutograd changed the inputs (duplicated or aliased inputs)"
    if any(info.mutation_type == MutationType.MUTATED_OUT_GRAPH for info in metadata.input_info):
        return "an input mutation is applied outside the graph"
    if metadata.num_intermediate_bases:
        return "an output is a view of an intermediate"
    supported = (
        OutputType.non_alias,
        OutputType.unsafe_view_alias,
        OutputType.custom_function_view,
        OutputType.is_input,
        OutputType.alias_of_input,
    )
    for info in metadata.output_info:
        if info.output_type not in supported:
            return f"an output of kind {info.output_type.name}"
    if lowered.call_outputs != len(metadata.tokens) + len(metadata.output_info):
        return "the graph returns values AOTAutograd's runtime consumes"
    return None


def output_plan(metadata: Any) -> list[tuple[Any, ...]]:
    from torch._functorch._aot_autograd.schemas import OutputType

    plan = []
    for index, info in enumerate(metadata.output_info):
        if info.output_type == OutputType.is_input:
            plan.append(("input", info.base_idx))
        elif info.output_type == OutputType.alias_of_input:
            plan.append(("view", index, info.base_idx))
        else:
            plan.append(("graph", index))
    return plan


def input_name(node: torch.fx.Node) -> str:
    from npugraph_ex.compat import source_name

    graph_argument = node.meta.get("grapharg")
    source = getattr(graph_argument, "source", None)
    return source_name(source) if source is not None else node.name


def input_kind(value: Any) -> tuple[Any, ...]:
    if isinstance(value, torch.SymInt | int):
        return ("int",)
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.device, value.requires_grad)
    return ("other", type(value).__name__)


def is_subclass(value: Any) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value)


def shape_guards(fake_mode: Any, placeholders: list[Any]) -> list[str]:
    """The shape environment's guards on ``placeholders`` (static sizes and strides included),
    one Python clause each over ``L['t<i>']``."""
    from torch._dynamo.source import LocalSource

    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        return []
    sources = [LocalSource(f"t{i}") for i in range(len(placeholders))]
    return list(shape_env.produce_guards(placeholders, sources, ignore_static=False))


def referenced_inputs(clause: str) -> frozenset[int]:
    return frozenset(int(i) for i in INPUT_NAME.findall(clause))
