"""The ``torch.compile`` backend: Dynamo graph -> AOTAutograd inference graph -> compiler.

AOTAutograd lifts parameters and buffers to inputs (marking them static), functionalises the
graph and keeps input mutations in it (``keep_inference_input_mutations=True``), so a KV-cache
write is a ``copy_`` into the caller's tensor inside the graph. Before that, Python floats the model
holds become guarded constants (``model_floats``), which may send Dynamo to trace the frame again.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch.fx
from torch._functorch.aot_autograd import aot_module_simplified

from npugraph_ex.compiler import LoweredGraph, compile_eagerly, compile_graph
from npugraph_ex.config import Config
from npugraph_ex.debug.once import log_once
from npugraph_ex.kernels.tier import KernelStore
from npugraph_ex.model_floats import specialise_model_floats

log = logging.getLogger(__name__)


def warn_break_graph_op_list() -> None:
    """TorchAir's ``BREAK_GRAPH_OP_LIST`` (``"SLICE,NN.CONV3D"``) patches Dynamo, when TorchAir
    is imported, to break graphs at the listed ops and modules; it is not applied here, and a
    script that sets it is told so once, with the fix."""
    listed = os.environ.get("BREAK_GRAPH_OP_LIST")
    if listed:
        log_once(
            log,
            logging.WARNING,
            "BREAK_GRAPH_OP_LIST",
            "npugraph_ex: BREAK_GRAPH_OP_LIST=%r is TorchAir's patch of Dynamo and is not "
            "applied here: the listed ops stay in the graph. Break the graph where you need it "
            "with torch._dynamo.graph_break(), or keep a module out of it with "
            "torch.compiler.disable.",
            listed,
        )


def npugraph_ex_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
    on_lowered: Callable[[LoweredGraph, Callable[[list[Any]], Any]], None] | None = None,
    kernel_store: KernelStore | None = None,
) -> Any:
    """``torch.compile(model, backend="npugraph_ex", options={...})``.

    ``options`` are the flat option names of the options reference; ``mode`` is what
    ``torch.compile(mode=...)`` passes. ``on_lowered`` sees each inference graph after the
    passes and the callable built from it (the compile cache records both there), and
    ``kernel_store`` keeps the background kernels its keys keep (the compile cache's folder).
    """
    specialise_model_floats(gm)  # may send Dynamo to trace again: before anything is built
    config = Config.from_options(options, mode=mode)
    warn_break_graph_op_list()
    if config.mode == "max-autotune":
        from torch._inductor.compile_fx import compile_fx as inductor_compile
        from torch._inductor.decomposition import select_decomp_table

        custom = config.custom_decompositions
        return inductor_compile(
            gm,
            example_inputs,
            config_patches={"max_autotune": True},
            decompositions={**select_decomp_table(), **custom} if custom else None,
        )
    return aot_module_simplified(
        gm,
        example_inputs,
        decompositions=config.custom_decompositions,
        fw_compiler=functools.partial(compile_eagerly, config=config),
        bw_compiler=functools.partial(compile_eagerly, config=config),
        inference_compiler=functools.partial(
            compile_graph, config=config, on_lowered=on_lowered, kernel_store=kernel_store
        ),
        keep_inference_input_mutations=True,
    )
