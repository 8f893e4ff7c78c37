"""The re-check of a match whose sizes are symbolic (``dynamic=True``).

A match is found by a pattern whose sizes are ignored, then re-checked by tracing the search
function again with the matched values, sizes and all, and matching that exact pattern at the
same place. Inductor's re-check passes the matched sizes' symbols in as inputs of that trace, so
that the pattern holds them as the graph does (an input, not a size read off a tensor), and
fails two ways on a model's graph:

- it takes a symbol only where it is provably different from every one it took before, and two
  symbols (``s0``, ``s1``) are not: only the first is passed, every other size is traced as
  ``sym_size`` of a tensor, which no graph holds in that place;
- the exact pattern holds the size arithmetic (``s0 * 4``, a batch times the heads) with the
  users it has in the pattern, while a graph computes it once for all its layers: a model of
  more than one layer never matches.

Every attention of a graph with a symbolic batch was left written out. Here every distinct
symbol is passed in (one input per distinct expression, each tensor re-made with those very
objects as its sizes, so that the trace reads each size as its input), and the exact pattern's
size arithmetic takes any number of users (it is never erased while the graph uses it). A match
with no symbol, or whose arguments are not one value each, keeps Inductor's re-check.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.passes.patterns.checks import bound

SYMBOL_ARGUMENT = "npugraph_ex_symbol_{}"
"""The name each symbol's input takes in the exact pattern (no search function argument's)."""


def install(
    pass_dict: Any,
    pattern: Any,
    search_fn: Callable[..., Any],
    replace_fn: Callable[..., Any],
    trace_fn: Callable[..., torch.fx.GraphModule],
    numbers: dict[str, Any],
    extra_check: Callable[[Any], bool],
) -> None:
    """Give the entry ``pattern`` registered in ``pass_dict`` the re-check of matches with
    symbolic sizes, then ``extra_check``; Inductor's own re-check keeps every other match."""
    entry = entry_of(pass_dict, pattern)
    if entry is None:
        return
    inductor_check = entry.extra_check
    names = argument_names(search_fn)

    def check(match: Any) -> bool:
        if not all(name in match.kwargs for name in names):
            return inductor_check(match)  # arguments bound as parts (a list of tensors)
        values = [bound(match, name) for name in names]
        symbols = distinct_symbols(values)
        fake_mode = torch._guards.detect_fake_mode(values)
        if not symbols or fake_mode is None or any(isinstance(v, (list, tuple)) for v in values):
            return inductor_check(match)
        with fake_mode:
            args = remade(values, symbols)
            try:
                exact = exact_pattern(search_fn, trace_fn, names, args, symbols, numbers)
            except RuntimeError:
                return False  # the search function cannot run on these values: no match
            found = exact.match(match.output_nodes()[0])
            if not (matched(found) and same_bindings(found, match, names)):
                return False
            if not extra_check(match):
                return False
            match.replacement_graph = trace_fn(replace_fn, args)
        return True

    entry.extra_check = check


def entry_of(pass_dict: Any, pattern: Any) -> Any:
    """The entry of ``pass_dict`` that holds ``pattern`` (None: none does)."""
    for entries in pass_dict.patterns.values():
        for entry in entries:
            if entry.pattern is pattern:
                return entry
    return None


def argument_names(search_fn: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(search_fn).parameters)


def distinct_symbols(values: Sequence[Any]) -> dict[Any, torch.SymInt]:
    """Each symbolic size or stride of the tensors in ``values``, one per expression, in order."""
    symbols: dict[Any, torch.SymInt] = {}
    for value in values:
        if not isinstance(value, torch.Tensor):
            continue
        for size in (*value.shape, *value.stride()):
            if isinstance(size, torch.SymInt) and not isinstance(size.node.maybe_as_int(), int):
                symbols.setdefault(size.node.expr, size)
    return symbols


def remade(values: Sequence[Any], symbols: dict[Any, torch.SymInt]) -> list[Any]:
    """Fresh tensors of the values' sizes, strides, dtypes and devices, each symbolic size the
    very object of ``symbols`` (a trace reads it as that symbol's input)."""

    def one(size: Any) -> Any:
        if isinstance(size, torch.SymInt) and size.node.expr in symbols:
            return symbols[size.node.expr]
        return size

    args = []
    for value in values:
        if isinstance(value, torch.Tensor):
            value = torch.empty_strided(
                [one(s) for s in value.shape],
                [one(s) for s in value.stride()],
                dtype=value.dtype,
                device=value.device,
            )
        args.append(value)
    return args


def exact_pattern(
    search_fn: Callable[..., Any],
    trace_fn: Callable[..., torch.fx.GraphModule],
    names: list[str],
    args: list[Any],
    symbols: dict[Any, torch.SymInt],
    numbers: dict[str, Any],
) -> Any:
    from torch._inductor.pattern_matcher import fx_to_pattern

    count = len(symbols)

    def with_symbols(*inputs: Any) -> Any:
        return search_fn(*inputs[count:])

    gm = trace_fn(with_symbols, [*symbols.values(), *args])
    symbol_names = [SYMBOL_ARGUMENT.format(i) for i in range(count)]
    pattern = fx_to_pattern(gm, argnames=[*symbol_names, *names], scalar_workaround=numbers)
    shared_size_arithmetic(pattern)
    return pattern


def shared_size_arithmetic(pattern: Any) -> None:
    """Let each node of ``pattern`` that computes a size (an operator on symbols, not an ATen op)
    take any number of users: a graph computes ``s0 * 4`` once for every layer."""
    from torch._inductor.pattern_matcher import MULTIPLE, PatternExpr

    seen: set[int] = set()
    stack = [pattern]
    while stack:
        node = stack.pop()
        if id(node) in seen or not isinstance(node, PatternExpr):
            continue
        seen.add(id(node))
        fns = getattr(node, "fns", None)
        if fns and not any(isinstance(fn, torch._ops.OpOverload) for fn in fns):
            node.users = MULTIPLE
        flat = getattr(node, "flat_args_kwargs", None)
        if flat is not None:
            stack.extend(flat[0])
        stack.extend(getattr(node, "outputs", ()))


def matched(found: Any) -> bool:
    from torch._inductor.pattern_matcher import is_match

    return bool(is_match(found))


def same_bindings(found: Any, match: Any, names: list[str]) -> bool:
    """The exact pattern bound each argument to what the first match bound it to."""
    return all(
        found.kwargs.get(name) is match.kwargs.get(name) for name in names if name in found.kwargs
    )
