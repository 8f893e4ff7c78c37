"""The post-AOT compiler: passes, then a capture manager on the graph's device runtime.

``compile_fx`` is public for users who build their own backend around
``aot_module_simplified``; the ``npugraph_ex`` backend calls the same code.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from npugraph_ex.capture.analysis import (
    GraphFacts,
    analyse_graph,
    graph_device_type,
    mutated_inputs,
)
from npugraph_ex.capture.deadlock import check_collective_order
from npugraph_ex.capture.dumping import DumpedCalls
from npugraph_ex.capture.key_shapes import KeySpecialiser, RowPlan
from npugraph_ex.capture.manager import CaptureManager
from npugraph_ex.capture.programs import KeyPrograms
from npugraph_ex.config import Config
from npugraph_ex.debug.compile_debug import compile_log, debug_folder, write_captured_graph
from npugraph_ex.debug.dump import TensorDumper, dumping_original, mark_origins
from npugraph_ex.debug.once import log_once
from npugraph_ex.kernels.symbolic import SymbolicSpec, symbolic_specs
from npugraph_ex.kernels.tier import KernelStore, KernelTier
from npugraph_ex.passes.fuse_patterns import CAPTURE_PATTERNS, DEFER_CAPTURE_PATTERNS
from npugraph_ex.passes.manager import PassManager, copy_of
from npugraph_ex.passes.pipeline import PIPELINE
from npugraph_ex.passes.split_host_ints import HOST_INTS, HostInts
from npugraph_ex.passes.stream_blocks import check_balanced
from npugraph_ex.runtime import DeviceRuntime, runtime_for
from npugraph_ex.runtime.platform import platform_for
from npugraph_ex.scope.ops import LIMIT_CORE_NUM, scopes_in

log = logging.getLogger(__name__)


def warn_unapplied_scopes(gm: torch.fx.GraphModule, runtime: DeviceRuntime, name: str) -> None:
    device_type = runtime.name
    if LIMIT_CORE_NUM in scopes_in(gm.graph) and not runtime.limits_cores():
        log_once(
            log,
            logging.WARNING,
            ("limit_core_num", device_type),
            "npugraph_ex: %s: limit_core_num has no effect on %s replays (this runtime cannot "
            "partition the device); the ops inside run on the whole device",
            name,
            device_type,
        )


def graph_name() -> str:
    """A name for the graph being compiled, after Dynamo's compile id where there is one."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    return f"graph[{compile_id}]" if compile_id is not None else "graph[standalone]"


def static_input_indices(num_inputs: int) -> list[int]:
    """Inputs that are parameters or buffers, as AOTAutograd recorded them for this compile."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    if metadata is None or metadata.static_input_indices is None:
        return []
    return [i for i in metadata.static_input_indices if i < num_inputs]


def boxed(fn: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """Mark ``fn`` as taking its arguments as one list, as AOTAutograd calls compiled graphs."""
    fn._boxed_call = True  # type: ignore[attr-defined]
    return fn


@dataclass
class LoweredGraph:
    """An AOT inference graph after every pass, with the facts its capture manager is made
    from. Its nodes' fake values are no longer needed: the compile cache stores it without them
    and builds a capture manager from it in a later process."""

    gm: torch.fx.GraphModule
    facts: GraphFacts
    host: HostInts | None
    """The ints the graph's call computes on the host, or None."""
    failed_passes: list[str]
    name: str
    original: torch.fx.GraphModule | None = None
    """The graph before the passes, kept where its tensors are dumped
    (``data_dump_stage="original"``)."""
    rows: RowPlan | None = None
    """Where its products' symbolic row counts come from, if it has any and the capture
    patterns ran on it (``key_shapes``)."""
    symbolic: list[SymbolicSpec] | None = None
    """Its inputs' symbolic sizes, for one background compile serving all its keys
    (``kernels/symbolic``), or None."""
    kernels_gm: torch.fx.GraphModule | None = None
    """With ``static_kernel_compile="background"``: the graph lowered for Inductor (without the
    capture-only passes, whose ``out=`` and in-place forms Inductor does not lower), called like
    ``gm``, which the ATen replay runs with them; None where the two would be called differently
    (then ``gm`` is the one lowered for Inductor, for both)."""

    @property
    def call_inputs(self) -> int:
        """How many arguments the call takes (data ints included)."""
        return self.facts.num_inputs if self.host is None else self.host.call_inputs

    @property
    def call_outputs(self) -> int:
        """How many values the call returns (data ints included)."""
        host_outputs = 0 if self.host is None else len(self.host.outputs)
        return len(self.gm.graph.output_node().args[0]) + host_outputs


def lower_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config, name: str
) -> LoweredGraph:
    """Run the passes on an AOT inference graph and read the facts of the result."""
    check_balanced(gm.graph)
    mark_origins(gm.graph)
    dumps_original = config.dump_tensor_data and config.data_dump_stage == "original"
    original = copy_of(gm) if dumps_original else None
    kernels_gm = None
    if config.static_kernel_compile == "background":
        gm, kernels_gm, passes = lower_twice(gm, example_inputs, config, name)
    else:
        passes = PassManager(PIPELINE, config, graph_name=name)
        gm = passes(gm, example_inputs)
    check_balanced(gm.graph)  # as a custom pass left it
    static = static_input_indices(len(example_inputs))
    host = gm.meta.get(HOST_INTS)
    if host is not None:
        example_inputs = host.example_inputs(example_inputs)
        static = host.kept_indices(static)
    facts = analyse_graph(gm, example_inputs, static)
    rows = RowPlan.of(gm) if gm.meta.get(CAPTURE_PATTERNS) else None
    symbolic = symbolic_specs(kernels_gm if kernels_gm is not None else gm)
    return LoweredGraph(
        gm, facts, host, list(passes.failed), name, original, rows, symbolic, kernels_gm
    )


SHARED_PASSES = frozenset(
    p.name for p in PIPELINE[: [p.name for p in PIPELINE].index("pattern_fusion_pass") + 1]
)
"""The passes both lowerings of ``lower_twice`` run alike, once: up to the pattern fusion's
shared patterns (the costly part: each match traces its replacement)."""


def lower_twice(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config, name: str
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule | None, PassManager]:
    """The graph lowered for the ATen replay (every pass) and for Inductor (without the
    capture-only passes), sharing the passes before they part; and the replay's pass manager.
    The replay's lowering runs the pattern fusion again, for its capture-only patterns (the
    shared ones, applied already, find nothing to replace). Where the two would be called
    differently, the one lowered for Inductor serves both (and no second graph is returned)."""
    capture_config = dataclasses.replace(config, static_kernel_compile=False)
    passes = PassManager(PIPELINE, capture_config, graph_name=name)
    rest = {p.name for p in PIPELINE} - SHARED_PASSES
    gm.meta[DEFER_CAPTURE_PATTERNS] = True
    gm = passes(gm, example_inputs, SHARED_PASSES)
    gm.meta.pop(DEFER_CAPTURE_PATTERNS, None)
    kernels = PassManager(PIPELINE, config, graph_name=f"{name}.kernels")
    kernels_gm = kernels(copy_of(gm), example_inputs, rest)
    gm = passes(gm, example_inputs, rest | {"pattern_fusion_pass"})
    if not same_calls(kernels_gm, gm):
        log.debug("%s: the capture passes changed the graph's calls; one graph for both", name)
        return kernels_gm, None, kernels
    return gm, kernels_gm, passes


def same_calls(a: torch.fx.GraphModule, b: torch.fx.GraphModule) -> bool:
    """Whether two lowerings of one graph are called alike: the same inputs (host ints split
    the same way), outputs, and inputs written."""
    host_a, host_b = a.meta.get(HOST_INTS), b.meta.get(HOST_INTS)
    if (host_a is None) != (host_b is None):
        return False
    if host_a is not None and (
        host_a.call_inputs != host_b.call_inputs or len(host_a.outputs) != len(host_b.outputs)
    ):
        return False
    inputs_a, inputs_b = a.graph.find_nodes(op="placeholder"), b.graph.find_nodes(op="placeholder")
    outputs_a, outputs_b = a.graph.output_node().args[0], b.graph.output_node().args[0]
    return (
        len(inputs_a) == len(inputs_b)
        and len(outputs_a) == len(outputs_b)
        and mutated_inputs(a.graph) == mutated_inputs(b.graph)
    )


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    config: Config,
    *,
    on_lowered: Callable[[LoweredGraph, Callable[[list[Any]], Any]], None] | None = None,
    kernel_store: KernelStore | None = None,
) -> Callable[[list[Any]], Any]:
    """Lower an AOT inference graph and wrap it in a capture manager; ``on_lowered`` sees the
    graph after the passes and the callable built from it."""
    name = graph_name()
    config = with_kernel_tier(config, graph_device_type(gm, example_inputs))
    with compile_log(debug_folder(config, name)):
        log.debug("%s: compiling %d nodes with %s", name, len(gm.graph.nodes), config)
        lowered = lower_graph(gm, example_inputs, config, name)
        call = build_graph_callable(lowered, config, kernel_store)
    if on_lowered is not None:
        on_lowered(lowered, call)
    return call


def with_kernel_tier(config: Config, device_type: str) -> Config:
    """``config`` with ``static_kernel_compile`` decided: the user's, or where unset, what the
    device's platform answers (``Platform.kernel_tier``), and the ATen replay where tensors are
    dumped (a dump reads the replay's kernels node by node)."""
    if config.static_kernel_compile is not None:
        return config
    tier = False if config.dump_tensor_data else platform_for(device_type).kernel_tier()
    return dataclasses.replace(config, static_kernel_compile=tier)


def key_specialiser(lowered: LoweredGraph) -> KeySpecialiser | None:
    """What splits the few-row products of each key of a graph whose capture patterns ran with
    symbolic row counts, where the platform of its device picks keys by their row counts
    (``Platform.key_rule``) and no ``limit_core_num`` block caps its threads
    (``capture/key_shapes.py``)."""
    if lowered.rows is None or LIMIT_CORE_NUM in scopes_in(lowered.gm.graph):
        return None
    rule = platform_for(lowered.facts.device_type).key_rule()
    if rule is None:
        return None
    return KeySpecialiser(lowered.gm, lowered.rows, lowered.name, rule)


def build_graph_callable(
    lowered: LoweredGraph, config: Config, kernel_store: KernelStore | None = None
) -> Callable[[list[Any]], Any]:
    """A capture manager for a lowered graph on its device's runtime, with the host ints'
    arithmetic around it; background kernels its keys keep go to ``kernel_store``."""
    gm, facts = lowered.gm, lowered.facts
    config = with_kernel_tier(config, facts.device_type)
    if config.deadlock_check:
        check_collective_order(gm, lowered.name)
    runtime = runtime_for(facts.device_type)
    warn_unapplied_scopes(gm, runtime, lowered.name)
    tier = config.static_kernel_compile
    kernels = (
        KernelTier(
            lowered.kernels_gm if tier == "background" and lowered.kernels_gm is not None else gm,
            facts.device_type,
            config,
            runtime.synchronize,
            lowered.symbolic if tier == "background" else None,
            kernel_store if tier == "background" else None,
            synchronous=tier is True,
        )
        if tier
        else None
    )
    dumper = TensorDumper(config, lowered.name) if config.dump_tensor_data else None
    dumps_replays = dumper is not None and lowered.original is None
    programs = KeyPrograms(
        gm,
        config,
        name=lowered.name,
        kernels=kernels,
        specialiser=key_specialiser(lowered),
        watched=dumps_replays and runtime.replays_watched(),
    )
    manager = CaptureManager(gm, facts, config, runtime, name=lowered.name, programs=programs)
    manager.stats.failed_passes.update(lowered.failed_passes)
    folder = debug_folder(config, lowered.name)
    if folder is not None:
        write_captured_graph(folder, gm, facts, lowered.host)
    call: Callable[[list[Any]], Any] = DumpedCalls(manager, dumper) if dumps_replays else manager
    call = call if lowered.host is None else lowered.host.wrap(call)
    if dumper is not None and lowered.original is not None:
        call = dumping_original(call, lowered.original, dumper)
    return boxed(call)


def compile_eagerly(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> Callable[[list[Any]], Any]:
    """The graph of a call that needs grad: run as is, never captured (backward is out of scope)."""
    log_once(
        log,
        logging.WARNING,
        ("needs grad", id(config)),
        "npugraph_ex: a compiled function was called with grad enabled on inputs that require "
        "grad; it runs without capture. Call it under torch.no_grad() or torch.inference_mode() "
        "to capture it.",
    )

    def run(args: list[Any]) -> Any:
        return gm(*args)

    return boxed(run)


def compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
) -> Callable[[list[Any]], Any]:
    """Compile an AOTAutograd inference graph (functional ATen ops) into a replaying callable.

    Use it as the ``fw_compiler``/``inference_compiler`` of your own ``aot_module_simplified``;
    the result takes its arguments boxed (one list), as AOTAutograd expects.
    """
    return compile_graph(gm, example_inputs, Config.from_options(options))
