"""The checks each option of :class:`~npugraph_ex.config.Config` runs on its value.

A check takes the option's name and the value given, and returns the value to store (a list
becomes a tuple) or raises a :class:`~npugraph_ex.errors.ConfigError` that names the option, the
value found and what is allowed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import field
from typing import Any, NoReturn

from npugraph_ex.errors import ConfigError, ConfigTypeError

Check = Callable[[str, Any], Any]
"""Validates ``value`` for option ``name`` and returns the value to store, or raises."""

MODES = ("npugraph_ex", "reduce-overhead", "max-autotune")
MODE_ALIASES = {"reduce-overhead": "npugraph_ex"}
NOT_A_POOL = (str, bytes, bool, int, float, list, dict, set)


def fail(name: str, allowed: str, value: Any, error: type[ConfigError] = ConfigError) -> NoReturn:
    options = {name: value}
    raise error(f"{name} must be {allowed}, got {value!r} (options={options!r})", option=name)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        fail(name, "a bool (True or False)", value, ConfigTypeError)
    return value


def check_kernel_tier(name: str, value: Any) -> bool | str | None:
    allowed = "True, False, 'background' or None (the device's default)"
    if value is None or value == "background" or isinstance(value, bool):
        return value
    fail(name, allowed, value, ConfigError if isinstance(value, str) else ConfigTypeError)


def check_gain(name: str, value: Any) -> float:
    allowed = "a number > 0 (int or float)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(name, allowed, value, ConfigTypeError)
    if not value > 0:
        fail(name, allowed, value)
    return float(value)


def check_int(minimum: int) -> Check:
    allowed = f"an int >= {minimum}"

    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail(name, allowed, value, ConfigTypeError)
        if value < minimum:
            fail(name, allowed, value)
        return value

    return check


def check_choice(choices: tuple[str, ...]) -> Check:
    allowed = "one of " + ", ".join(repr(choice) for choice in choices)

    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            fail(name, allowed, value, ConfigTypeError)
        if value not in choices:
            fail(name, allowed, value)
        return value

    return check


def check_mode(name: str, value: Any) -> str:
    """A mode, with ``"reduce-overhead"`` taken quietly as ``"npugraph_ex"``: TorchAir's
    ``CompilerConfig`` lists it as this mode's older name, and Hugging Face's ``CompileConfig``
    passes it by default, so ``generate(compile_config=CompileConfig(backend="npugraph_ex"))``
    sends it on every call."""
    value = check_choice(MODES)(name, value)
    return MODE_ALIASES.get(value, value)


def check_int_values(name: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        fail(name, "a list or tuple of ints, or None", value, ConfigTypeError)
    return tuple(value)


def check_decompositions(name: str, value: Any) -> dict[Any, Callable[..., Any]] | None:
    from torch._ops import OpOverload, OpOverloadPacket

    allowed = "a dict of ATen ops (such as torch.ops.aten.gelu.default) to callables, or None"
    if value is None:
        return None
    if not isinstance(value, dict):
        fail(name, allowed, value, ConfigTypeError)
    table: dict[Any, Callable[..., Any]] = {}
    # An overload packet stands for each of its overloads; an overload named itself wins.
    for op, fn in sorted(value.items(), key=lambda item: isinstance(item[0], OpOverload)):
        if not isinstance(op, (OpOverload, OpOverloadPacket)) or not callable(fn):
            fail(name, allowed, value, ConfigTypeError)
        if isinstance(op, OpOverloadPacket):
            table.update({getattr(op, overload): fn for overload in op.overloads()})
        else:
            table[op] = fn
    return table or None


def check_callable(name: str, value: Any) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        fail(name, "a callable taking the FX graph, or None", value, ConfigTypeError)
    return value


def check_dict(name: str, value: Any) -> dict[Any, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        fail(name, "a dict or None", value, ConfigTypeError)
    return dict(value)  # a private copy: the caller mutating theirs must not change a Config


def check_pool(name: str, value: Any) -> Any:
    if isinstance(value, NOT_A_POOL):
        allowed = "a graph pool handle (e.g. torch.cuda.graph_pool_handle()) or None"
        fail(name, allowed, value, ConfigTypeError)
    return value


def check_path(name: str, value: Any) -> str:
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str):
        fail(name, "a str or os.PathLike", value, ConfigTypeError)
    return path


def check_optional_path(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not isinstance(os.fspath(value), str):
        fail(name, "a str, os.PathLike or None", value, ConfigTypeError)
    return os.fspath(value)


def check_names(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        fail(name, "a list or tuple of pass names (str)", value, ConfigTypeError)
    return tuple(value)


BUILD_STEPS = ("fold_constants", "place", "share_views")
"""The CPU replay engine's build steps a key's program is right without
(``runtime/cpu/build.py``)."""


def check_build_steps(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(v in BUILD_STEPS for v in value):
        fail(name, f"a list or tuple of build step names from {BUILD_STEPS}", value)
    return tuple(value)


def check_patterns(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(value.split())
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        fail(name, "a list or tuple of patterns (str), or one str of them", value, ConfigTypeError)
    return tuple(value)


CALL_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_calls(spec: str) -> list[tuple[int, int]]:
    """Call selections as TorchAir writes dump steps: ``"0|2-4"`` as inclusive ranges
    ``[(0, 0), (2, 4)]``; ``""`` as no ranges (every call). Raises ValueError naming the part it
    cannot read."""
    ranges = []
    for part in spec.replace(" ", "").split("|") if spec.strip() else ():
        match = CALL_RANGE.match(part)
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ValueError(f"cannot read {part!r}: write calls as 'N' or 'N-M' joined by '|'")
        ranges.append((int(match[1]), int(match[2] or match[1])))
    return ranges


def check_calls(name: str, value: Any) -> str:
    if not isinstance(value, str):
        fail(name, "a str of calls such as '0|2-4'", value, ConfigTypeError)
    try:
        parse_calls(value)
    except ValueError as error:
        fail(name, f"calls such as '0|2-4' ({error})", value)
    return value


def checked_field(default: Any, check: Check) -> Any:
    return field(default=default, metadata={"check": check})
