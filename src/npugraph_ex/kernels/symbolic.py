"""One background compile for every key of a graph traced with dynamic shapes.

A graph Dynamo traced with ``dynamic=True`` has symbolic sizes, and each key is one assignment of
them (the growing loop: one key per sequence length). Instead of a compile per key, the worker
lowers the graph once with its sizes left symbolic, as Inductor does for Dynamo:

    serving process:  placeholders' sizes as text        ("tensor", ("s0", 16), ("16", 1), ...)
                      + the requesting key's concrete sizes (hints: s0 = 7)
    worker:           fresh symbols with those hints -> fake inputs -> Inductor
                      -> compiled graph + the guards Inductor added ("L['t2'].size()[0] != 1")
    serving process:  a key whose inputs pass the guards calls the shared kernels; one that
                      fails them gets a compile of its own

A size that is an expression of symbols (``s0 + 1``) is remade from them; a symbol that is never
a size or int input of its own cannot be given a value, and such a graph compiles per key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

SymbolicSpec = tuple[Any, ...]
"""A placeholder's ``("tensor", sizes, strides)`` with each symbolic entry as text, its
``("symint", text)``, or ``("static",)`` for anything without symbols."""


def symbolic_specs(gm: torch.fx.GraphModule) -> list[SymbolicSpec] | None:
    """The placeholders' symbolic sizes, or None where the graph has none (a static graph) or
    has a symbol no placeholder gives a value of its own."""
    specs: list[SymbolicSpec] = []
    named: set[str] = set()
    """Symbols that are a size or an int input by themselves: a key's inputs give their values."""
    used: set[str] = set()

    def note(entry: Any) -> None:
        if isinstance(entry, torch.SymInt):
            expr = entry.node.expr
            if expr.is_Symbol:
                named.add(str(expr))
            used.update(str(s) for s in expr.free_symbols)

    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt):
            specs.append(("symint", str(value.node.expr)))
            note(value)
        elif isinstance(value, torch.Tensor) and has_symbols(value):
            sizes = tuple(as_text(s) for s in value.shape)
            strides = tuple(as_text(s) for s in value.stride())
            specs.append(("tensor", sizes, strides))
            for entry in (*value.shape, *value.stride()):
                note(entry)
        elif isinstance(value, torch.SymFloat | torch.SymBool):
            return None
        else:
            specs.append(("static",))
    if not used or not used <= named:
        return None
    return specs


def has_symbols(tensor: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*tensor.shape, *tensor.stride()))


def as_text(entry: Any) -> int | str:
    return str(entry.node.expr) if isinstance(entry, torch.SymInt) else int(entry)


def symbolic_inputs(symbolic: Sequence[SymbolicSpec], args: Sequence[Any], fake_mode: Any) -> list:
    """In the worker: fake inputs with fresh symbols for the graph's, hinted by ``args`` (the
    requesting key's inputs as fake tensors with its concrete sizes, and its ints)."""
    import sympy
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    shape_env = fake_mode.shape_env
    hints: dict[str, int] = {}
    for spec, arg in zip(symbolic, args, strict=True):
        for text, value in pairs(spec, arg):
            if isinstance(text, str) and text.isidentifier():
                hints.setdefault(text, int(value))
    if any(hint in (0, 1) for hint in hints.values()):
        raise ValueError("a symbolic size is 0 or 1 at this key, which Dynamo specialises")
    symbols = {
        name: shape_env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        for name, hint in hints.items()
    }

    def made(text: int | str, value: int) -> Any:
        if isinstance(text, int):
            return text
        expr = sympy.sympify(text, locals=symbols)
        return shape_env.create_symintnode(expr, hint=int(value))

    inputs = []
    for spec, arg in zip(symbolic, args, strict=True):
        if spec[0] == "symint":
            inputs.append(made(spec[1], arg))
        elif spec[0] == "tensor":
            sizes = [made(t, v) for t, v in zip(spec[1], arg.shape, strict=True)]
            strides = [made(t, v) for t, v in zip(spec[2], arg.stride(), strict=True)]
            with fake_mode:
                inputs.append(
                    torch.empty_strided(sizes, strides, dtype=arg.dtype, device=arg.device)
                )
        else:
            inputs.append(arg)
    return inputs


def pairs(spec: SymbolicSpec, arg: Any) -> list[tuple[Any, Any]]:
    """The symbolic entries of one placeholder beside the requesting key's values."""
    if spec[0] == "symint":
        return [(spec[1], arg)]
    if spec[0] == "tensor":
        return [*zip(spec[1], arg.shape, strict=True), *zip(spec[2], arg.stride(), strict=True)]
    return []


def guards_of(fake_mode: Any, inputs: Sequence[Any]) -> str | None:
    """In the worker, after the compile: what a key's inputs must satisfy to use its kernels
    (every guard the trace and Inductor added), as text over ``L['t<i>']``; None when none."""
    return fake_mode.shape_env.produce_guards_expression(list(inputs))


def guards_hold(guards: str | None, args: Sequence[Any]) -> bool:
    """Whether a key's inputs satisfy a symbolic compile's guards."""
    if guards is None:
        return True
    names = {"L": {f"t{i}": a for i, a in enumerate(args)}}
    return bool(eval(guards, SYMPY_INTERP, names))  # noqa: S307 - guards from our own worker
