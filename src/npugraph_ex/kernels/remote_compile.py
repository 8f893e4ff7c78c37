"""What a compile process does with a request: the graph lowered by Inductor for the layouts of a
key's inputs (or with its sizes left symbolic, ``symbolic``), sent back serialised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npugraph_ex.kernels.graph_bytes import load_graph
from npugraph_ex.kernels.static_compile import lower
from npugraph_ex.kernels.symbolic import SymbolicSpec, guards_of, symbolic_inputs
from npugraph_ex.runtime import runtime_for
from npugraph_ex.runtime.platform import platform_for

NOTHING_TO_COMPILE = "nothing to compile: the graph runs no op"
"""Why a key whose graph runs no op (``x.detach()``) keeps its ATen replay: Inductor hands such
a graph back as it is, which no compile process can send."""

InputSpec = tuple[Any, ...]
"""A tensor input's ``("tensor", sizes, strides, dtype, device)``, or ``("value", v)``."""


def input_specs(args: Sequence[Any]) -> list[InputSpec]:
    return [
        ("tensor", tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type)
        if isinstance(a, torch.Tensor)
        else ("value", a)
        for a in args
    ]


def compile_in_worker(
    graph: bytes,
    specs: list[InputSpec],
    device: str,
    use_cache: bool,
    symbolic: list[SymbolicSpec] | None = None,
    threads: int = 0,
    answers: dict[Any, Any] | None = None,
) -> tuple[bytes, str | None, dict[Any, Any]]:
    """In the compile process: the graph lowered for inputs like ``specs`` (with the sizes of
    ``symbolic`` left symbolic, where given), as Inductor's compiled graph serialised for the
    serving process; the guards of a symbolic compile; and the facts of the host its load needs
    (``DeviceRuntime.loading_facts``). ``threads``: the serving process's intra-op threads, which
    Inductor's CPU kernels are written for (the compile process, pinned to fewer cores, would
    count its own); ``answers``: what the serving process measured of the host
    (``Platform.measured_answers``), which the compile's choices then follow."""
    if threads > 0:
        torch.set_num_threads(threads)
    if answers:
        platform_for(device).take_measured_answers(answers)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    with fake_mode:  # the inputs' layouts, without their memory
        args = [
            torch.empty_strided(spec[1], spec[2], dtype=spec[3], device=spec[4])
            if spec[0] == "tensor"
            else spec[1]
            for spec in specs
        ]
    if symbolic is not None:
        args = symbolic_inputs(symbolic, args, fake_mode)
    with runtime_for(device).loading_facts() as facts:
        compiled = lower(load_graph(graph), args, device, use_cache, fake_mode)
    guards = guards_of(fake_mode, args) if symbolic is not None else None
    if not hasattr(compiled, "prepare_for_serialization"):  # the graph itself: no op left
        raise RuntimeError(NOTHING_TO_COMPILE)
    compiled.prepare_for_serialization()
    return GraphPickler.dumps(compiled), guards, facts
