"""Python floats a model holds become constants of its graph, guarded by Dynamo.

With ``dynamic=True`` Dynamo passes every Python float it reads as a 0-d float64 tensor input,
created anew on every call: an RMSNorm's ``variance_epsilon``, an attention's ``scaling``, a
rotary embedding's ``attention_scaling`` (23 of them in a 4-layer Qwen3). The graph then adds or
multiplies by a tensor where it would use a number, so:

- patterns whose fused kernel takes the number (``_fused_rms_norm``'s ``eps``,
  ``scaled_dot_product_attention``'s ``scale``) cannot match;
- each replay copies those scalars in and converts them, kernels the constant form does not have;
- a device graph would read a host scalar, whose value capture freezes.

So before AOTAutograd runs, the backend asks Dynamo to trace the frame again with those floats
specialised (``TensorifyState``, the mechanism Inductor uses for floats it cannot compile): each
becomes a constant of the graph and Dynamo guards its value, so changing it recompiles rather
than replaying a stale value. Only floats held by ``nn.Module`` objects (anywhere in the model
tree) and module-level globals are configuration; floats passed to the compiled function (as
arguments, inside containers, or as attributes of argument objects such as a sampling config)
are data: they stay inputs.

    before: %eps: f64[] = placeholder;  %e = item(%eps);  %y = add(%var, %e)
    after:  %y = add(%var, 1e-06)        (guard: L['self'].norm.variance_epsilon == 1e-06)

``TensorifyState`` is process-wide and keyed by Dynamo's symbol names, which come from a hash of
the float's source name modulo 100 (``zf37``): a name left there would make a float of any frame
compiled later, by any backend, a constant when its name collides (about one in four, after a
Qwen3). So the names npugraph_ex adds are taken out again when the frame's compile ends.
"""

from __future__ import annotations

import logging

import torch.fx
from torch._dynamo import callback_handler
from torch._dynamo import source as dynamo_sources
from torch._dynamo.exc import TensorifyScalarRestartAnalysis
from torch._dynamo.symbolic_convert import TensorifyState
from torch._guards import GuardSource

from npugraph_ex.compat import source_guard, source_name
from npugraph_ex.debug.once import log_once

log = logging.getLogger(__name__)

ADDED: set[str] = set()
"""Symbols npugraph_ex asked Dynamo to specialise in the compile under way."""


def forget_added_symbols(*ignored: object) -> None:
    """Dynamo's end-of-compile callback: the frame is traced, its specialisations are spent."""
    for symbol in ADDED:
        TensorifyState.force_specializations.discard(symbol)
    ADDED.clear()


def held_by_the_model(source: dynamo_sources.Source) -> bool:
    """Whether a float is configuration: on an ``nn.Module``, or a global."""
    guard = source_guard(source)
    return (
        guard.is_unspecialized_nn_module()
        or guard.is_specialized_nn_module()
        or guard.is_fsdp_module()
        or guard is GuardSource.GLOBAL
    )


def float_symbol(node: torch.fx.Node) -> str | None:
    """The symbol (``zf0``) of a placeholder Dynamo made from a Python float, else None.

    Dynamo's float inputs are 0-d tensors whose only users are ``item()`` calls, the form its
    own specialisation step (``OutputGraph.remove_tensorify_specialized_graphargs``) rewrites.
    """
    value = node.meta.get("example_value")
    memo = getattr(value, "item_memo", None)
    if memo is None or not all(user.target == "item" for user in node.users):
        return None
    symbol = getattr(memo.node, "_expr", None)
    return getattr(symbol, "name", None)


def model_float_symbols(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Symbol -> source name of every float input the model holds, not yet specialised."""
    found = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        graph_arg = node.meta.get("grapharg")
        symbol = float_symbol(node)
        if graph_arg is None or symbol is None or TensorifyState.should_specialize(symbol):
            continue
        if held_by_the_model(graph_arg.source):
            found[symbol] = source_name(graph_arg.source)
    return found


def specialise_model_floats(gm: torch.fx.GraphModule) -> None:
    """Have Dynamo retrace the frame with the model's floats as guarded constants.

    Returns when there is nothing to specialise, so the second trace (or a float Dynamo kept as
    an input anyway) goes on to compile: never a restart loop.
    """
    symbols = model_float_symbols(gm)
    if not symbols:
        return
    for symbol in symbols:
        TensorifyState.specialize(symbol)
    ADDED.update(symbols)
    if forget_added_symbols not in callback_handler.end_callbacks:
        # Registered per compile: torch._dynamo.reset() drops every callback.
        callback_handler.register_end_callback(forget_added_symbols)
    names = sorted(symbols.values())
    log_once(
        log,
        logging.INFO,
        ("model floats", tuple(names)),
        "npugraph_ex: %d Python floats read from the model become guarded constants (%s%s); "
        "Dynamo traces the frame again",
        len(names),
        names[0],
        f" and {len(names) - 1} more" if len(names) > 1 else "",
    )
    raise TensorifyScalarRestartAnalysis
