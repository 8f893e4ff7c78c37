"""Registration of patterns: the pattern passes, ``register_replacement`` (the public one) and
``add_replacement`` (into any of the passes), and the tracing both use.

Built on Inductor's pattern matcher: a pattern is an example function traced to ATen; a match is
re-traced with the matched shapes and checked again before it is replaced, so sizes a pattern
was traced with never stand in for other sizes. Patterns are traced as the backend's graphs are
(``make_fx`` without decompositions: the ATen ops AOTAutograd's inference graphs hold).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.passes.graph_facts import within_one_scope
from npugraph_ex.passes.patterns import symbolic_recheck
from npugraph_ex.passes.patterns.registration import (
    check_arities,
    check_same_results,
    check_scalar_workaround,
    results_agree,
    traced_inputs,
)


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
    search_fn_pattern: Any = None,
) -> bool:
    """Replace every match of ``search_fn`` in compiled graphs by ``replace_fn``.

    ``example_inputs`` are traced through both functions (tensors of any size: matches are
    re-checked with their own shapes); ``extra_check(match)`` may refuse a match;
    ``skip_duplicates=True`` makes registering the same pattern twice a no-op instead of an
    error; ``search_fn_pattern`` (an Inductor ``PatternExpr``, as TorchAir and Inductor take it)
    is matched instead of the graph traced from ``search_fn``. Returns whether the pattern was
    added.

    ``scalar_workaround`` maps each number (float or int) argument of ``search_fn`` to an example
    value (``{"scale": 0.1}``): the pattern is traced with it and binds, in each match, the
    number the graph holds in its place, which the replacement receives, so one pattern serves
    every value. The pattern finds such an argument by its example value: give each a value of
    its own that the function uses nowhere else.

    ``search_fn`` and ``replace_fn`` take the same arguments; ``example_inputs`` holds one value
    per argument not named in ``scalar_workaround``, in order (Inductor's form), or one per
    argument with a number in each named one's place; for them, ``replace_fn`` returns what
    ``search_fn`` returns (as many results, each of the same shape, dtype and device). Anything
    else raises ``TypeError`` here, naming the function and the fix.

    A match never spans the edge of a scope (``npugraph_ex.scope``) or an in-place op, whatever
    ``extra_check`` says.
    """
    return add_replacement(
        registry(),
        search_fn,
        replace_fn,
        example_inputs,
        extra_check,
        trace_fn,
        scalar_workaround=scalar_workaround,
        skip_duplicates=skip_duplicates,
        search_fn_pattern=search_fn_pattern,
        results_checked=True,
    )


def add_replacement(
    pass_dict: Any,
    search_fn: Callable[..., Any],
    replace_fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    extra_check: Callable[[Any], bool] | None = None,
    trace_fn: Callable[..., torch.fx.GraphModule] = trace_aten,
    results_checked: bool = False,
    **options: Any,
) -> bool:
    """``register_replacement`` into ``pass_dict``, refusing matches that span a scope edge;
    with ``results_checked`` (a user's pattern), the two functions' results are compared for the
    example inputs first (``registration.check_same_results``) and for each match's values
    (``registration.results_agree``: a match where they differ is refused)."""
    from torch._inductor import pattern_matcher

    numbers = options.get("scalar_workaround") or {}
    check_arities(search_fn, replace_fn)
    check_scalar_workaround(search_fn, numbers)
    inputs = traced_inputs(search_fn, example_inputs, numbers)
    agree = None
    if results_checked:
        check_same_results(search_fn, replace_fn, inputs, numbers)
        agree = results_agree(search_fn, replace_fn, numbers)

    def check(match: Any) -> bool:
        return (
            within_one_scope(match.nodes)
            and other_arguments_at_defaults(match)
            and (extra_check is None or extra_check(match))
            and (agree is None or agree(match))
        )

    added = pattern_matcher.register_replacement(
        search_fn, replace_fn, inputs, trace_fn, pass_dict, check, **options
    )
    if added and options.get("search_fn_pattern") is None:
        symbolic_recheck.install(pass_dict, added, search_fn, replace_fn, trace_fn, numbers, check)
    return bool(added)


def other_arguments_at_defaults(match: Any) -> bool:
    """Each keyword argument a matched node holds that its pattern does not name holds its
    default. Inductor's matcher leaves such arguments out of the comparison, and the replacement
    would drop them: ``sdpa(q, k, v)`` would match ``sdpa(q, k, v, attn_mask=m)`` and lose the
    mask, ``x + y`` would match ``add(x, y, alpha=2)``."""
    from torch._inductor.pattern_matcher import _TargetArgsExpr

    for pattern, node in match.ctx.pattern_to_node.items():
        if not isinstance(pattern, _TargetArgsExpr) or not isinstance(node, torch.fx.Node):
            continue
        others = {name: value for name, value in node.kwargs.items() if name not in pattern.kwargs}
        if others and not all_defaults(node.target, others):
            return False
    return True


def all_defaults(target: Any, arguments: dict[str, Any]) -> bool:
    """Each of ``arguments`` (name: value) is one of ``target``'s with its default value (an op
    without a schema: none is)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    return all(
        name in defaults and not isinstance(value, torch.fx.Node) and value == defaults[name]
        for name, value in arguments.items()
    )
