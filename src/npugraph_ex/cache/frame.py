"""Dynamo's compiled frame, stored and rebuilt: the bytecode that runs a method around its graph.

Dynamo rewrites a traced method into bytecode that gathers the graph's inputs from the
arguments (``self``'s parameters included, so a new model instance binds its own), calls the
compiled graph, and builds the method's result, applying the side effects the tracing found
(a ``StaticCache`` filling its layers on first use, say). The cache stores that bytecode with
``marshal`` and, per global name Dynamo installed for it, what to bind in a later process:

- ``__compiled_fn_*``: a stored graph (by position);
- ``__import_*`` and ``___module_*``: a module, by name;
- other installed globals: an object importable by module and qualified name.

A frame that resumes after a graph break (``__resume_at_*``), or that reads an installed global
none of these cover, is not stored; ``FrameError`` says why.
"""

from __future__ import annotations

import importlib
import marshal
import pickle
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npugraph_ex.errors import NpuGraphExError

COMPILED_FN = "__compiled_fn"
INSTALLED = ("__import_", "___")
CONSTANT_MARK = "<npugraph_ex object>"


class FrameError(NpuGraphExError):
    """A compiled frame the cache cannot store."""


@dataclass
class FrameRecord:
    code: bytes
    """The marshalled bytecode, with importable objects among its constants replaced by marks."""
    bindings: dict[str, tuple[Any, ...]]
    """Installed global name -> ``("graph", i)``, ``("module", name)`` or
    ``("object", module, qualname)``."""
    constants: dict[int, tuple[Any, ...]]
    """Constant index -> ``("object", module, qualname)`` of a class or function it held, or
    ``("pickle", bytes)`` of another value ``marshal`` cannot store (a ``torch.device``)."""


def record_frame(code: types.CodeType, f_globals: dict[str, Any]) -> tuple[FrameRecord, list[Any]]:
    """Store Dynamo's bytecode for a frame; also return the compiled functions it calls, in
    the order of their ``("graph", i)`` bindings."""
    bindings: dict[str, tuple[Any, ...]] = {}
    graphs: list[Any] = []
    for name in code.co_names:
        if name.startswith("__resume_at"):
            raise FrameError("the method has a graph break (Dynamo resumes in another frame)")
        if name.startswith(COMPILED_FN):
            bindings[name] = ("graph", len(graphs))
            graphs.append(f_globals[name])
        elif name.startswith(INSTALLED) and name in f_globals:
            bindings[name] = importable(name, f_globals[name])
    constants = {}
    replaced = list(code.co_consts)
    for index, constant in enumerate(code.co_consts):
        stored = stored_constant(constant)
        if stored is not None:
            constants[index] = stored
            replaced[index] = CONSTANT_MARK
    try:
        data = marshal.dumps(code.replace(co_consts=tuple(replaced)))
    except ValueError as error:
        raise FrameError(f"the bytecode holds a constant that cannot be stored ({error})") from None
    return FrameRecord(data, bindings, constants), graphs


def stored_constant(constant: Any) -> tuple[Any, ...] | None:
    """How to store a constant ``marshal`` cannot, or None when it can."""
    if isinstance(constant, (type, types.FunctionType)):
        return importable(repr(constant), constant)
    try:
        marshal.dumps(constant)
    except ValueError:
        try:
            return ("pickle", pickle.dumps(constant))
        except Exception as error:
            raise FrameError(
                f"the bytecode holds a constant {constant!r} that cannot be stored ({error})"
            ) from None
    return None


def loaded_value(stored: tuple[Any, ...]) -> Any:
    """The value a ``("module", ...)``, ``("object", ...)`` or ``("pickle", ...)`` stands for."""
    if stored[0] == "pickle":
        return pickle.loads(stored[1])  # noqa: S301 - a private file of this user, checked
    if stored[0] == "module":
        return importlib.import_module(stored[1])
    value = resolve(stored[1], stored[2])
    if value is None:
        raise FrameError(f"{stored[1]}.{stored[2]} cannot be imported")
    return value


def importable(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qualname and resolve(module, qualname) is value:
        return ("object", module, qualname)
    raise FrameError(f"Dynamo's global {name} ({type(value).__name__}) cannot be stored")


def resolve(module: str, qualname: str) -> Any:
    try:
        value: Any = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    return value


def bind_frame(
    record: FrameRecord, function: types.FunctionType, graphs: list[Callable[..., Any]]
) -> types.FunctionType:
    """The stored bytecode as a function over ``function``'s globals, closure and defaults, its
    compiled-function globals bound to ``graphs``."""
    code = marshal.loads(record.code)
    if code.co_freevars != function.__code__.co_freevars:
        raise FrameError(
            f"the method's closure changed: {code.co_freevars} -> {function.__code__.co_freevars}"
        )
    constants = list(code.co_consts)
    for index, stored in record.constants.items():
        constants[index] = loaded_value(stored)
    code = code.replace(co_consts=tuple(constants))
    scope = dict(function.__globals__)
    for name, binding in record.bindings.items():
        scope[name] = graphs[binding[1]] if binding[0] == "graph" else loaded_value(binding)
    rebuilt = types.FunctionType(
        code, scope, function.__name__, function.__defaults__, function.__closure__
    )
    rebuilt.__kwdefaults__ = function.__kwdefaults__
    return rebuilt
