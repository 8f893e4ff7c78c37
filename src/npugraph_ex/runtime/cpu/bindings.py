"""The fastest way to call each recorded kernel on replay.

Calling an ``OpOverload`` from Python goes through the JIT schema matcher (about 1.6 us a call);
PyTorch's own bindings (``torch.mm``, ``torch._C._nn.silu``, ``Tensor.index_copy_``) parse their
arguments faster (about 1 us). A binding is used only when it provably dispatches to the very
overload that was recorded: it is called once under a probe mode that sees which ATen kernel it
reaches, and runs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

NAMESPACES = (
    torch._C._VariableFunctions,
    torch._C._nn,
    torch._C._linalg,
    torch._C._special,
    torch._C._fft,
    torch._C.TensorBase,
)


class WrongKernel(Exception):
    """Raised inside the probe when a binding reaches another kernel than the recorded one."""


class KernelProbe(TorchDispatchMode):
    """Sees the first kernel a call reaches and returns its written arguments without running.

    The binding passes only if it reaches the recorded kernel with the very same arguments:
    the same tensor objects, and every other argument equal, defaults filled in (a binding may
    pass its own default: ``torch._C._nn.mse_loss(x, y, out=o)`` passes ``reduction=0`` where the
    recorded call left the schema's mean).
    """

    def __init__(self, expected: OpOverload, args: tuple, kwargs: dict):
        super().__init__()
        self.expected = expected
        self.values = schema_values(expected, args, kwargs)
        self.written: Any = None
        """What the kernel would return (its written arguments), once it is reached."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is not self.expected or not same_values(
            schema_values(func, args, kwargs), self.values
        ):
            raise WrongKernel(str(func))
        written = [
            kwargs[arg.name] if arg.name in kwargs else args[position]
            for position, arg in enumerate(func._schema.arguments)
            if arg.alias_info is not None and arg.alias_info.is_write
        ]
        self.written = written[0] if len(written) == 1 else tuple(written)
        return self.written


MISSING = object()


def schema_values(op: OpOverload, args: tuple, kwargs: dict) -> list[Any]:
    """The value of every schema argument of a call, its default where the call passes none."""
    values = []
    for position, argument in enumerate(op._schema.arguments):
        if position < len(args) and not argument.kwarg_only:
            values.append(args[position])
        elif argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            values.append(MISSING)
    return values


def same_values(a: Any, b: Any) -> bool:
    """Tensors by identity, sequences item by item (a list equals a tuple), the rest by ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, RuntimeError):
        return False


def kind_of(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(kind_of(item) for item in value)
    return type(value).__name__


def argument_shape(args: tuple, kwargs: dict) -> tuple:
    """What decides which overload a binding picks: the Python types of the arguments."""
    positional = tuple(kind_of(value) for value in args)
    named = tuple(sorted((name, kind_of(value)) for name, value in kwargs.items()))
    return positional, named


RESOLVED: dict[tuple[OpOverload, tuple], Callable[..., Any]] = {}
"""The callable chosen for each (kernel, argument types); a raw ``OpOverload`` call by default."""


def reaches(binding: Callable[..., Any], op: OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether ``binding`` runs ``op`` on these very tensors and returns what it wrote.

    Both halves matter: some bindings (``Tensor.__lshift__`` given ``out=``) return
    ``NotImplemented`` without reaching any kernel, and a replay through them writes nothing.
    """
    probe = KernelProbe(op, args, kwargs)
    try:
        with probe:
            returned = binding(*args, **kwargs)
    except (WrongKernel, TypeError, RuntimeError):
        return False
    return probe.written is not None and same_values(returned, probe.written)


def fastest_call(op: OpOverload, args: tuple, kwargs: dict) -> Callable[..., Any]:
    """A callable that runs exactly ``op(*args, **kwargs)``, as fast as Python allows."""
    key = (op, argument_shape(args, kwargs))
    if key not in RESOLVED:
        RESOLVED[key] = op._op
        name = op.overloadpacket.__name__
        for namespace in NAMESPACES:
            binding = getattr(namespace, name, None)
            if binding is not None and reaches(binding, op, args, kwargs):
                RESOLVED[key] = binding
                break
    return RESOLVED[key]
