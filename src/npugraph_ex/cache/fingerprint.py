"""Fingerprints of what a cached graph was traced against, so a reuse that would break is a miss.

Dynamo guards a compiled frame on what its tracing read; a cached frame runs without Dynamo, so
the cache checks the same things in its own terms:

- ``describe``: a call's arguments and the objects inside them as nested tuples: types, Python
  numbers and strings by value, containers by length and contents, tensors by dtype, device,
  rank and ``requires_grad`` (their sizes and strides are the cached graph's shape guards).
  Objects (a ``StaticCache``, a config) count by type and attributes, a few levels deep.
- ``module_structure``: every submodule's class, mode and plain attributes (an RMSNorm's ``eps``
  is a constant of the graph), and every parameter and buffer's name, dtype, shape and device.
- ``global_state``: the global modes Dynamo guards (grad, autocast, default dtype, ...).
- ``code_digest``: a function's code, recursively through nested code objects, for the methods
  and the callables in the options.
- ``package_digest``: this package's own source, whose passes made the stored graph (a build
  that changes a pass, at the same version number, must not load graphs the old one made).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, enum.Enum)
DEPTH = 6
"""How deep ``describe`` follows objects' attributes; deeper values count by type only."""


def describe(
    value: Any, depth: int = DEPTH, seen: frozenset[int] = frozenset(), *, private: bool = True
) -> Any:
    """A hashable description of ``value`` that changes whenever a trace of it could; without
    ``private``, objects' ``_names`` are left out (configuration keeps caches and hashes there)."""
    if isinstance(value, PLAIN):
        return (type(value).__name__, value)
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.device, value.dim(), value.requires_grad)
    if isinstance(value, torch.nn.Module):
        return ("module", qualified_name(type(value)))
    if depth == 0 or id(value) in seen:
        return ("ref", qualified_name(type(value)))
    inner = seen | {id(value)}
    if isinstance(value, (list, tuple)):
        return (
            type(value).__name__,
            tuple(describe(v, depth - 1, inner, private=private) for v in value),
        )
    if isinstance(value, dict):
        return (
            type(value).__name__,
            tuple(
                (describe(k, 1, inner), describe(v, depth - 1, inner, private=private))
                for k, v in value.items()
            ),
        )
    if callable(value):  # classes too
        named = value if hasattr(value, "__qualname__") else type(value)
        return ("callable", qualified_name(named))
    attributes = getattr(value, "__dict__", None)
    if attributes is None:
        return ("object", qualified_name(type(value)))
    return (
        qualified_name(type(value)),
        tuple(
            (name, describe(v, depth - 1, inner, private=private))
            for name, v in attributes.items()
            if private or not name.startswith("_")
        ),
    )


def module_structure(module: torch.nn.Module) -> str:
    """A digest of ``module``'s tree: classes, modes, plain attributes, parameters, buffers."""
    parts: list[Any] = []
    for name, submodule in module.named_modules(remove_duplicate=False):
        attributes = tuple(
            (key, describe(value, depth=2, private=False))
            for key, value in vars(submodule).items()
            if not key.startswith("_")
        )
        parts.append((name, qualified_name(type(submodule)), submodule.training, attributes))
    for name, tensor in module.named_parameters(remove_duplicate=False):
        parts.append(("parameter", name, tensor_layout(tensor)))
    for name, tensor in module.named_buffers(remove_duplicate=False):
        parts.append(("buffer", name, tensor_layout(tensor)))
    return digest(parts)


def tensor_layout(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.device, tensor.requires_grad)


def global_state() -> tuple[Any, ...]:
    """The global modes a trace depends on."""
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        torch.is_autocast_enabled("cuda"),
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
    )


def code_digest(function: Callable[..., Any] | None) -> str:
    """A digest of a callable's code (recursively), or of its name when it has no code."""
    if function is None:
        return "none"
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    if code is None:
        return digest(qualified_name(function))
    return digest(code_parts(code))


def code_parts(code: types.CodeType) -> tuple[Any, ...]:
    constants = tuple(
        code_parts(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts
    )
    return (
        code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
        code.co_code,
        constants,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
    )


def qualified_name(value: Any) -> str:
    module = getattr(value, "__module__", None) or "?"
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or repr(value)
    return f"{module}.{name}"


def digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


def file_digest(path: str) -> str | None:
    """The sha256 of a source file's bytes, or None when it cannot be read."""
    try:
        with open(path, "rb") as stream:
            return hashlib.sha256(stream.read()).hexdigest()
    except OSError:
        return None


PACKAGE = Path(__file__).resolve().parents[1]


@functools.cache
def package_digest(root: Path = PACKAGE) -> str:
    """The sha256 of the names and bytes of every Python file under ``root`` (this package)."""
    total = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        total.update(path.relative_to(root).as_posix().encode())
        total.update(hashlib.sha256(path.read_bytes()).digest())
    return total.hexdigest()
