"""The pattern registry behind ``pattern_fusion_pass`` and ``npugraph_ex.register_replacement``.

Built on Inductor's pattern matcher: a pattern is an example function traced to ATen; a match is
re-traced with the matched shapes and checked again before it is replaced, so sizes a pattern
was traced with never stand in for other sizes. Patterns are traced as the backend's graphs are
(``make_fx`` without decompositions: the ATen ops AOTAutograd's inference graphs hold).

Built-in patterns are registered on first use, one module per pattern in this package, each
stating its numeric tolerance against eager and checking what it binds before it replaces it
(``checks``: a tensor or a number, dtype, device, broadcast shape).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.passes.graph_facts import within_one_scope


def trace_aten(fn: Callable[..., Any], args: Sequence[Any], **ignored: Any) -> torch.fx.GraphModule:
    """Trace ``fn`` to the ATen graph ``pattern_fusion_pass`` sees (no decompositions, and the
    no-ops ``remove_noop_ops`` removes before it gone: a same-dtype cast is not in the graph).

    Inductor's matcher also passes its own decomposition table; the backend applies none, so
    patterns must not either.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    from npugraph_ex.config import Config
    from npugraph_ex.passes.remove_noop import remove_noop_ops

    with torch.no_grad():
        gm = make_fx(fn, tracing_mode="real")(*args)
    remove_noop_ops(gm, args, Config())
    canonical_spellings(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def canonical_spellings(graph: torch.fx.Graph) -> None:
    """Write ops that have two spellings one way, so patterns and graphs compare equal.

    - ``_unsafe_view`` becomes ``view``: tracers differ in which one a reshape of a fresh tensor
      gives (``make_fx`` one, AOTAutograd's functionalisation the other), and both alias the same
      memory.
    - ``transpose(x, -1, -2)`` becomes ``transpose(x, 2, 3)`` on a 4-d ``x``: dims non-negative
      and in ascending order (models write both; the matcher compares arguments literally).
    """
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten._unsafe_view.default:
            node.target = torch.ops.aten.view.default
        elif node.target is torch.ops.aten.transpose.int and len(node.args) == 3:
            node.args = (node.args[0], *transpose_dims(node))


def transpose_dims(node: torch.fx.Node) -> tuple[int, int]:
    """The two dims of a ``transpose.int`` node, non-negative and ascending where its input's
    rank is known (as written otherwise)."""
    source, first, second = node.args
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return first, second
    rank = max(value.dim(), 1)
    first, second = first % rank, second % rank
    return min(first, second), max(first, second)


@functools.cache
def registry() -> Any:
    """Patterns for every graph, however its kernels run (captured ATen kernels or static
    kernels); the patterns users register go here."""
    from torch._inductor.pattern_matcher import PatternMatcherPass

    return PatternMatcherPass(pass_name="npugraph_ex_pattern_fusion")


@functools.cache
def capture_registry() -> Any:
    """Patterns for graphs that are captured as ATen kernels, left out of graphs lowered with
    ``static_kernel_compile`` (which rewrite the same ops their own, faster way)."""
    from torch._inductor.pattern_matcher import PatternMatcherPass

    return PatternMatcherPass(pass_name="npugraph_ex_capture_patterns")


@functools.cache
def product_registry() -> Any:
    """Capture-only patterns applied after ``capture_registry``'s, to the matrix products it left
    (the same search as the few-row split's, which one pass cannot hold twice)."""
    from torch._inductor.pattern_matcher import PatternMatcherPass

    return PatternMatcherPass(pass_name="npugraph_ex_product_patterns")


def register_replacement(
    search_fn: Callable[..., Any],
    replace_fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    trace_fn: Callable[..., torch.fx.GraphModule] = trace_aten,
    extra_check: Callable[[Any], bool] | None = None,
    scalar_workaround: dict[str, float | int] | None = None,
    skip_duplicates: bool = False,
) -> bool:
    """Replace every match of ``search_fn`` in compiled graphs by ``replace_fn``.

    ``example_inputs`` are traced through both functions (tensors of any size: matches are
    re-checked with their own shapes); ``extra_check(match)`` may refuse a match;
    ``scalar_workaround`` names float/int arguments with an example value, so the pattern takes
    them as arguments instead of constants; ``skip_duplicates=True`` makes registering the same
    pattern twice a no-op instead of an error. Returns whether the pattern was added.

    ``search_fn`` and ``replace_fn`` take the same arguments, one per example input: a
    mismatch raises ``TypeError`` here, naming both functions.

    A match never spans the edge of a scope (``npugraph_ex.scope``) or an in-place op, whatever
    ``extra_check`` says.
    """
    return add_replacement(
        registry(),
        search_fn,
        replace_fn,
        example_inputs,
        trace_fn,
        extra_check,
        scalar_workaround=scalar_workaround,
        skip_duplicates=skip_duplicates,
    )


def add_replacement(
    pass_dict: Any,
    search_fn: Callable[..., Any],
    replace_fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    trace_fn: Callable[..., torch.fx.GraphModule],
    extra_check: Callable[[Any], bool] | None,
    **options: Any,
) -> bool:
    """``register_replacement`` into ``pass_dict``, refusing matches that span a scope edge."""
    from torch._inductor import pattern_matcher

    check_arities(search_fn, replace_fn, example_inputs)

    def check(match: Any) -> bool:
        return within_one_scope(match.nodes) and (extra_check is None or extra_check(match))

    added = pattern_matcher.register_replacement(
        search_fn, replace_fn, list(example_inputs), trace_fn, pass_dict, check, **options
    )
    return bool(added)


def arity(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments ``fn`` takes (None: any number, ``*args``)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional)


def arguments(count: int) -> str:
    return f"{count} argument" if count == 1 else f"{count} arguments"


def check_arities(
    search_fn: Callable[..., Any], replace_fn: Callable[..., Any], example_inputs: Sequence[Any]
) -> None:
    """Both functions take one argument per example input: the matcher binds the graph's values
    to the search function's arguments and passes them, by position, to the replacement."""
    search_arity, replace_arity = arity(search_fn), arity(replace_fn)
    search_name = getattr(search_fn, "__qualname__", repr(search_fn))
    replace_name = getattr(replace_fn, "__qualname__", repr(replace_fn))
    if search_arity is not None and replace_arity is not None and search_arity != replace_arity:
        raise TypeError(
            f"register_replacement: search function {search_name}() takes "
            f"{arguments(search_arity)} but replacement function {replace_name}() takes "
            f"{arguments(replace_arity)}; both "
            "must take the same arguments, in the same order, one per example input"
        )
    if search_arity is not None and search_arity != len(example_inputs):
        raise TypeError(
            f"register_replacement: search function {search_name}() takes "
            f"{arguments(search_arity)} but {len(example_inputs)} example inputs were given; "
            "give one example input per argument"
        )


@functools.cache
def register_builtin_patterns() -> None:
    from npugraph_ex.passes.patterns import (
        eager_attention,
        gqa_attention,
        mm_bias,
        onednn_linear,
        rms_norm,
        row_products,
    )

    eager_attention.register()
    gqa_attention.register()
    mm_bias.register()
    rms_norm.register()
    row_products.register(capture_registry())
    onednn_linear.register(product_registry())
