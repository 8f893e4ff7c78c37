"""TorchAir's option objects: what a field accepts, and how ``.value`` reads it back.

TorchAir keeps each option of its ``CompilerConfig`` in an object that checks what is assigned
(its enumerated choices, an int range, a type) and reads it back through ``.value``, in the shape
TorchAir code compares against::

    config.debug.run_eagerly = True
    config.debug.run_eagerly.value        # "1": torchair.CompilerConfig turns bools into "1"/"0"
    config.force_eager = True
    config.force_eager.value              # True: npugraph_ex.CompilerConfig keeps bools

A few TorchAir attributes are plain (``aclgraph_config.use_custom_pool``,
``debug.data_dump.filter``) and read back as assigned. The checks here are TorchAir's cheap ones;
:class:`~npugraph_ex.config.Config` validates the flat options they map to when the backend is
built.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npugraph_ex.errors import ConfigError, ConfigTypeError

__all__ = ["INT64_MAX", "Kind", "OptionValue"]

INT64_MAX = 2**63 - 1

Check = Callable[[str, Any], Any]
"""Checks ``value`` assigned to the field spelt ``name``; returns what to store, or raises."""


def as_text(value: Any) -> Any:
    """torchair.CompilerConfig's ``.value``: None stays None, bools read "1"/"0", the rest str."""
    if value is None:
        return None
    if str(value) == str(True):
        return "1"
    if str(value) == str(False):
        return "0"
    return str(value)


def as_flat_text(value: Any) -> Any:
    """npugraph_ex.CompilerConfig's ``.value``: None and bools as they are, the rest str."""
    return value if value is None or isinstance(value, bool) else str(value)


def as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Kind:
    """What a field accepts and how it reads."""

    check: Check
    shape: Callable[[Any], Any] = as_text
    """Stored value -> what ``.value`` returns."""
    choices: tuple[Any, ...] | None = None
    """TorchAir's enumerated choices (its ``optional``), or None."""
    wrapped: bool = True
    """False for an attribute TorchAir keeps plain: reading it gives the value itself."""

    def flat(self) -> Kind:
        """The same kind, read as npugraph_ex.CompilerConfig reads its flat options."""
        shape = as_flat_text if self.shape is as_text else self.shape
        return Kind(self.check, shape, self.choices, self.wrapped)


def accept(name: str, value: Any) -> Any:
    return value


def choice(*choices: Any) -> Kind:
    """One of ``choices``, compared with ``==`` as TorchAir does (``1`` is ``True``); the
    matching choice is stored, so a bool field holds a bool."""
    allowed = ", ".join(repr(c) for c in choices)

    def check(name: str, value: Any) -> Any:
        for candidate in choices:
            if type(value) is type(candidate) and value == candidate:
                return candidate
        for candidate in choices:
            if value == candidate and not isinstance(value, str):
                return candidate
        raise ConfigError(f"{name} must be one of {allowed}, got {value!r}")

    return Kind(check, choices=choices)


def int_range(low: int, high: int = INT64_MAX) -> Kind:
    def check(name: str, value: Any) -> Any:
        if not isinstance(value, int):
            raise ConfigTypeError(f"{name} must be an int in [{low}, {high}], got {value!r}")
        if not low <= value <= high:
            raise ConfigError(f"{name} must be an int in [{low}, {high}], got {value!r}")
        return value

    return Kind(check)


def typed(allowed: type | tuple[type, ...], description: str, shape: Callable[[Any], Any]) -> Kind:
    """None, or a value of type ``allowed``."""

    def check(name: str, value: Any) -> Any:
        if value is not None and not isinstance(value, allowed):
            raise ConfigTypeError(f"{name} must be {description} or None, got {value!r}")
        return value

    return Kind(check, shape)


def check_int_list(name: str, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise ConfigTypeError(f"{name} must be a list of ints or None, got {value!r}")
    return value


def check_callable(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise ConfigTypeError(f"{name} must be a callable or None, got {value!r}")
    return value


def check_real_path(name: str, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigTypeError(f"{name} must be a str or os.PathLike, got {value!r}")
    return os.path.realpath(value)


BOOL = choice(True, False)
ANY = Kind(accept)
TEXT = typed(str, "a str", as_text)
DICT = typed(dict, "a dict", as_is)
INT_LIST = Kind(check_int_list, as_is)
FUNCTION = Kind(check_callable, as_is)
PLAIN = Kind(accept, as_is, wrapped=False)
REAL_PATH = Kind(check_real_path, as_is, wrapped=False)
"""TorchAir's ``debug.graph_dump.path``: stored as ``os.path.realpath`` of what was given."""


class OptionValue:
    """One option of a TorchAir-style config, as TorchAir's own option objects behave:
    ``.value`` reads it, assigning ``.value`` (or the attribute on its group) checks the new
    value, ``bool()`` is the truth of the value stored."""

    __slots__ = ("_kind", "_name", "_value", "default", "is_set")

    def __init__(self, name: str, kind: Kind, default: Any) -> None:
        self._name = name
        self._kind = kind
        self._value = default
        self.default = default
        """TorchAir's default of this option (npugraph_ex's where they differ: ``mode``)."""
        self.is_set = False
        """Whether a value was assigned (even the default)."""

    @property
    def value(self) -> Any:
        return self._kind.shape(self._value)

    @value.setter
    def value(self, value: Any) -> None:
        self._value = self._kind.check(self._name, value)
        self.is_set = True

    @property
    def optional(self) -> list[Any] | None:
        """TorchAir's list of allowed values, or None when any value of the type is allowed."""
        return None if self._kind.choices is None else list(self._kind.choices)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return f"OptionValue({self._name}={self._value!r})"
