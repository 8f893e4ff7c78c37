"""What ``register_replacement`` checks of its arguments before it registers anything, each
failure a ``TypeError`` that names the function and the fix: both functions take the same
arguments, the example inputs fit them, ``scalar_workaround`` names number arguments with values
of their own, and, for a user's pattern, the replacement returns what the search function returns
for the example inputs (as many results, each of the same shape, dtype and device: the graph past
a match was traced on the search function's results). And, for a user's pattern, the match
check that compares the two functions' results on each match's values (``results_agree``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._guards import detect_fake_mode

from npugraph_ex.debug.source import source_line
from npugraph_ex.passes.graph_facts import same_result, value_text
from npugraph_ex.passes.patterns.checks import bound, is_number

log = logging.getLogger(__name__)


def arity(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments ``fn`` takes (None: any number, ``*args``)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional)


def positional_names(fn: Callable[..., Any]) -> list[str] | None:
    """The names of ``fn``'s positional arguments, in order (None: any number, ``*args``)."""
    count = arity(fn)
    return None if count is None else list(inspect.signature(fn).parameters)[:count]


def arguments(count: int) -> str:
    return f"{count} argument" if count == 1 else f"{count} arguments"


def example_inputs_text(count: int) -> str:
    return f"{count} example input" if count == 1 else f"{count} example inputs"


def name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))


def check_arities(search_fn: Callable[..., Any], replace_fn: Callable[..., Any]) -> None:
    """Both functions take the same arguments: the matcher binds the graph's values to the search
    function's arguments and passes them, by position, to the replacement."""
    search_arity, replace_arity = arity(search_fn), arity(replace_fn)
    if search_arity is not None and replace_arity is not None and search_arity != replace_arity:
        raise TypeError(
            f"register_replacement: search function {name_of(search_fn)}() takes "
            f"{arguments(search_arity)} but replacement function {name_of(replace_fn)}() takes "
            f"{arguments(replace_arity)}; both must take the same arguments, in the same order "
            "(the replacement is called with what the search function bound)"
        )


def traced_inputs(
    search_fn: Callable[..., Any], example_inputs: Sequence[Any], numbers: dict[str, Any]
) -> list[Any]:
    """The example inputs as Inductor's ``register_replacement`` takes them: one per argument of
    ``search_fn`` that ``numbers`` (``scalar_workaround``) does not name, in order (it fills each
    named argument from ``numbers``, each other from the next example input).

    Also taken: one example input per argument, a number in the place of each named one; those
    numbers are dropped (the pattern is traced with ``numbers``' values).
    """
    names, inputs = positional_names(search_fn), list(example_inputs)
    if names is None:
        return inputs
    count = len(names)
    named = [index for index, name in enumerate(names) if name in numbers]
    if named and len(inputs) == count and all(is_number(inputs[i]) for i in named):
        return [value for index, value in enumerate(inputs) if index not in named]
    if len(inputs) == count - len(named):
        return inputs
    takes = f"takes {arguments(count)}"
    if named:
        takes += (
            f", {len(named)} of them named in scalar_workaround "
            f"({', '.join(names[i] for i in named)}), so it needs "
            f"{example_inputs_text(count - len(named))},"
        )
    given = "was" if len(inputs) == 1 else "were"
    raise TypeError(
        f"register_replacement: search function {name_of(search_fn)}() {takes} but "
        f"{example_inputs_text(len(inputs))} {given} given; give one example input per argument "
        "not named in scalar_workaround, and name each argument that takes a number there: "
        "scalar_workaround={name: example value}"
    )


def check_scalar_workaround(search_fn: Callable[..., Any], numbers: dict[str, Any]) -> None:
    """Each name is an argument of ``search_fn`` with a number of its own as example value: the
    pattern tells a number argument by its example value where the traced graph holds it."""
    parameters = list(inspect.signature(search_fn).parameters)
    by_value: dict[Any, str] = {}
    for name, value in numbers.items():
        if name not in parameters:
            raise TypeError(
                f"register_replacement: scalar_workaround names {name!r}, which is not an "
                f"argument of search function {name_of(search_fn)}() (its arguments: "
                f"{', '.join(parameters)}); name the arguments that take a number"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"register_replacement: scalar_workaround[{name!r}] must be a float or an int "
                f"(the example value of a number argument), got {type(value).__name__}"
            )
        if value in by_value:
            raise TypeError(
                f"register_replacement: scalar_workaround gives {by_value[value]!r} and "
                f"{name!r} the same example value {value!r}; give each a different value (the "
                "pattern tells number arguments apart by their example values)"
            )
        by_value[value] = name


def check_same_results(
    search_fn: Callable[..., Any],
    replace_fn: Callable[..., Any],
    inputs: Sequence[Any],
    numbers: dict[str, Any],
) -> None:
    """For the example inputs (``traced_inputs``, with ``numbers`` in their places), the
    replacement returns as many results as the search function, each of the same shape, dtype
    and device. Where either function fails on them, tracing it reports that instead."""
    try:
        expected, returned = results_of(
            search_fn, replace_fn, called_with(search_fn, inputs, numbers)
        )
    except Exception:  # noqa: BLE001 - the tracing that follows reports it
        return
    if not same_result(flat(returned), flat(expected)):
        raise TypeError(
            f"register_replacement: for the example inputs, replacement function "
            f"{name_of(replace_fn)}() returns {results_text(returned)} where search function "
            f"{name_of(search_fn)}() returns {results_text(expected)}; the replacement must "
            "return the same results (as many, each of the same shape, dtype and device): the "
            "graph past a match was traced on the search function's"
        )


def results_agree(
    search_fn: Callable[..., Any], replace_fn: Callable[..., Any], numbers: dict[str, Any]
) -> Callable[[Any], bool]:
    """A match check: the replacement returns, for the values the match bound (fake tensors),
    what the search function returns (``same_result``); where not, the match is refused and
    the first refusal of the pattern is logged. A user's replacement may agree with its search
    function on the example inputs and not on a match (``(x * y).to(x.dtype)`` for a float16
    ``x`` and a float32 ``y``)."""
    names = positional_names(search_fn)
    refused: list[str] = []

    def agree(match: Any) -> bool:
        if names is None or any(n not in match.kwargs and n not in numbers for n in names):
            return True  # bound otherwise than by name: the replacement's tracing decides
        values = [bound(match, name, numbers.get(name)) for name in names]
        mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
        try:
            with mode or contextlib.nullcontext():
                expected, returned = results_of(search_fn, replace_fn, values)
        except Exception as error:  # noqa: BLE001 - a replacement that cannot run is refused
            return refuse(match, f"raises {type(error).__name__}: {error}")
        if same_result(flat(returned), flat(expected)):
            return True
        return refuse(
            match,
            f"returns {results_text(returned)} where {name_of(search_fn)}() returns "
            f"{results_text(expected)}",
        )

    def refuse(match: Any, why: str) -> bool:
        if not refused:
            refused.append(why)
            log.warning(
                "npugraph_ex: a match of search function %s() is left as it is: replacement "
                "function %s() %s (at %s)",
                name_of(search_fn),
                name_of(replace_fn),
                why,
                source_line(match.output_node()),
            )
        return False

    return agree


def called_with(
    search_fn: Callable[..., Any], inputs: Sequence[Any], numbers: dict[str, Any]
) -> list[Any]:
    """The arguments the pattern is traced with: each named in ``numbers`` its example value,
    each other the next of ``inputs``."""
    names = positional_names(search_fn)
    if names is None or not numbers:
        return list(inputs)
    rest = iter(inputs)
    return [numbers[name] if name in numbers else next(rest) for name in names]


def results_of(
    search_fn: Callable[..., Any], replace_fn: Callable[..., Any], arguments: list[Any]
) -> tuple[Any, Any]:
    """What each function returns for ``arguments``, each called on copies of them."""
    with torch.no_grad():
        return search_fn(*fresh(arguments)), replace_fn(*fresh(arguments))


def fresh(arguments: list[Any]) -> list[Any]:
    """Copies of the tensors among ``arguments`` (fake ones under their mode): a function that
    writes its inputs leaves the other's, and the graph's values, as they were."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in arguments]


def flat(results: Any) -> list[Any]:
    return torch.utils._pytree.tree_leaves(results)


def results_text(results: Any) -> str:
    """Each result as ``dtype [sizes] on device`` (a non-tensor by its type), in order."""
    leaves = flat(results)
    return value_text(leaves[0]) if len(leaves) == 1 else value_text(leaves)
