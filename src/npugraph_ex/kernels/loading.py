"""Compiled kernels a compile process sent, loaded into the serving process.

A load runs Python (Inductor unpickles its compiled graph, compiles the wrapper's source and
finds the kernels' library: about 2.5 ms for the tiny Qwen3), so it runs in the serving thread at
a call boundary (``capture/tiers``), never in a thread beside a replay: a Python-busy thread
makes the replay, which takes the interpreter lock back after every kernel, wait at each one.
What the first load in a process would find out about the host (on CPU, a second of compiler
probes) comes from the compile process instead (``DeviceRuntime.prepare_kernel_loading``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npugraph_ex.kernels.static_compile import positional
from npugraph_ex.runtime import runtime_for


def import_loading_modules() -> None:
    """Import what a load imports (Inductor's loading code; ``cpp_extension``, which the C++
    wrapper's load reads, imports setuptools: about 60 ms), at a key's first capture, which
    pays seconds anyway: not in the call boundary of the process's first load."""
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.debug  # noqa: F401
    import torch._inductor.output_code  # noqa: F401
    import torch.fx._graph_pickler  # noqa: F401
    import torch.utils.cpp_extension  # noqa: F401


def load_compiled(data: bytes, device_type: str, facts: dict[Any, Any]) -> Callable[..., Any]:
    """The compiled graph a compile process sent, ready to call like the FX graph (positional
    inputs)."""
    import torch._inductor.debug  # noqa: F401  (a compiled graph's call reads it)
    from torch._inductor.output_code import CompiledFxGraphConstants
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler

    runtime_for(device_type).prepare_kernel_loading(facts)
    compiled = GraphPickler.loads(data, FakeTensorMode())
    compiled.after_deserialization(CompiledFxGraphConstants())
    return positional(compiled)
