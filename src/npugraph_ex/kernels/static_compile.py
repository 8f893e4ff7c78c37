"""``static_kernel_compile``: Inductor kernels specialised to each captured key's shapes.

A graph compiled with ``dynamic=True`` carries symbolic sizes; its eager replay is exact for any
of them, but kernels generated for symbolic sizes pay for that generality. For each key the
capture manager captures, this stage re-traces the optimised graph with the key's concrete sizes
and ints (every symbol becomes a constant), decomposed as Inductor expects:

    before: mm(view(x, [s0, 256]), w)            # s0 symbolic
    after:  mm(view(x, [7, 256]), w)             # this key: s0 == 7

and lowers it through Inductor (C++ with ``cpp_wrapper`` where the device's platform says so, as
the CPU's does; Triton on CUDA). The device runtime then captures those kernels (CUDA, NPU) or
calls them (CPU, where fused C++ kernels are invisible to a dispatch-level recording).

Kernel artifacts go to Inductor's FX graph cache (``TORCHINDUCTOR_CACHE_DIR``), so a later process
compiling the same graph for the same shapes loads them instead of compiling;
``disable_static_kernel_compile_cache`` compiles afresh in a private directory every time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx

from npugraph_ex.capture.analysis import graph_draws_random_numbers
from npugraph_ex.compat import inductor_inference_passes
from npugraph_ex.errors import CaptureError
from npugraph_ex.kernels.decompositions import static_kernel_decompositions
from npugraph_ex.passes.patterns.onednn_linear import LINEAR
from npugraph_ex.runtime.platform import platform_for
from npugraph_ex.scope.ops import scopes_in

CompiledKernels = Callable[..., Any]
"""Called like the FX graph (positional inputs); returns its outputs."""


def chosen(chooses: Callable[[Sequence[int]], bool], args: Sequence[Any]) -> bool:
    """Whether a key with inputs ``args`` gets kernels: ``static_kernel_sym_index`` and
    ``static_kernel_sym_values`` (``Config.static_kernels_for``, as ``chooses``) choose keys by
    one of the graph's int inputs."""
    return chooses([a for a in args if type(a) is int])


def positional(compiled: Any) -> CompiledKernels:
    """Inductor's compiled graph, called like the FX graph (positional inputs)."""

    def run(*inputs: Any) -> Any:
        # Inductor's calling convention: one list, which the callee may clear.
        return compiled(list(inputs))

    return run


def lower(
    gm: torch.fx.GraphModule,
    args: Sequence[Any],
    device_type: str,
    use_cache: bool,
    fake_mode: Any = None,
) -> Any:
    """Inductor's compiled ``gm`` for inputs like ``args`` (only their sizes, strides, dtypes
    and devices are read, and the ints' values); ``args`` may be fake tensors of ``fake_mode``
    already (a background worker's, which has no real inputs)."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    scopes = scopes_in(gm.graph)
    if scopes:
        raise CaptureError(
            f"the graph holds npugraph_ex.scope blocks ({', '.join(scopes)}), "
            "which Inductor cannot lower"
        )
    if fake_mode is None:
        # Inductor's FX graph cache needs a shape env in the tracing context, even when every
        # size is static.
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        args = [
            fake_mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a
            for a in args
        ]
    fake_args = list(args)
    cpp_wrapper = platform_for(device_type).cpp_wrapper()
    options: dict[str, Any] = {"cpp_wrapper": cpp_wrapper}
    if device_type == "cpu":
        # Inductor writes its C++ kernels for this many threads (``omp parallel num_threads``);
        # named in the config, the count is in the FX graph cache's key on every torch (2.11
        # left it out): a child forked onto one thread (``runtime/cpu/forked``) then compiles
        # for one, where kernels loaded for two would wait forever for a second thread.
        options["cpp.threads"] = torch.get_num_threads()
    if graph_draws_random_numbers(gm.graph):
        # Random ops as ATen calls, drawing eager's numbers from eager's generator: the ATen
        # replay's (the swap compares the two), and the only form ``compile_fx_inner`` lowers
        # (Inductor's own random kernels need the seeds its whole-graph passes put in).
        options["fallback_random"] = True
    if not use_cache:
        options.update(fx_graph_cache=False, force_disable_caches=True)
    context = torch._guards.TracingContext(fake_mode)
    with (
        torch._guards.tracing(context),
        torch._inductor.config.patch(options),
        onednn_linear_as_extern_call(),
    ):
        static_gm = inductor_inference_passes(
            specialise(gm, fake_args, fake_mode), input_device(fake_args)
        )
        return compile_fx_inner(static_gm, fake_args, cpp_wrapper=cpp_wrapper, is_inference=True)


@contextlib.contextmanager
def onednn_linear_as_extern_call() -> Iterator[None]:
    """While a key is lowered: oneDNN's linear (which ``decompositions`` puts in for products
    by a weight) lowered as a call of its ATen kernel. Inductor's own lowering of it is for
    ``freezing``, whose weights are constants it has packed, and refuses a weight that is a
    graph input; the call reads the weight as it is."""
    from torch._inductor import lowering

    if LINEAR is None:  # no oneDNN in this build: the decompositions put no call in
        yield
        return
    table = lowering.lowerings
    made = table.get(LINEAR)
    table[LINEAR] = lowering.fallback_handler(LINEAR, add_to_fallback_set=False)
    try:
        yield
    finally:
        if made is None:
            del table[LINEAR]
        else:
            table[LINEAR] = made


def input_device(args: Sequence[Any]) -> torch.device | None:
    """The device of the first tensor input, which Inductor's passes take as the graph's."""
    return next((a.device for a in args if isinstance(a, torch.Tensor)), None)


def input_signature(args: Sequence[Any]) -> tuple:
    """What compiled kernels depend on: sizes, strides, dtypes and devices, and int values."""
    return tuple(
        (tuple(a.shape), a.stride(), a.dtype, a.device)
        if isinstance(a, torch.Tensor)
        else (type(a), a)
        for a in args
    )


def specialise(
    gm: torch.fx.GraphModule, fake_args: Sequence[Any], fake_mode: Any
) -> torch.fx.GraphModule:
    """``gm`` re-traced on inputs with static sizes, decomposed for Inductor (``decompositions``).

    Symbolic sizes and int inputs turn into the constants of ``fake_args``; the int inputs stay
    placeholders (unused), so the graph keeps the calling convention of ``gm``.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    devices = {a.device.type for a in fake_args if isinstance(a, torch.Tensor)}
    decompositions = static_kernel_decompositions(devices.pop() if len(devices) == 1 else "")
    with fake_mode:
        static = make_fx(gm, decomposition_table=decompositions, tracing_mode="real")(*fake_args)
    # Without the values nothing reads, as the ATen graph (``passes/dead_code``; random and
    # writing ops are kept): the re-trace keeps a ``getitem`` for each result of a multi-result
    # op, and Inductor's lowering of an op may return fewer results than its trace had (its CPU
    # flex attention, when nothing reads the log-sum-exp): the unread item then failed the
    # lowering ("tuple index out of range").
    if static.graph.eliminate_dead_code():
        static.recompile()
    return static
