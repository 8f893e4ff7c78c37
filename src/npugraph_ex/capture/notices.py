"""What a capture manager says once per graph: limits reached, graphs refused, keys that differ
only in values, and the error of a strict refusal."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import UnsupportedGraphError

log = logging.getLogger("npugraph_ex.capture.manager")

VALUE_KEYS_NOTICE = 4
"""Keys that differ only in the values of the graph's int (or host scalar) inputs, after which
the graph says that every new value is a new capture."""


MOVED_INPUTS_NOTICE = 4
"""Captures of one key in a row, each because a tensor the graph writes arrived at a new
address, after which the graph says that such calls capture instead of replaying."""


def strict_error(name: str, blocker: str) -> UnsupportedGraphError:
    return UnsupportedGraphError(
        f"{name} cannot be captured: {blocker}. Set "
        "options={'strict_capture': False} to run it eagerly instead."
    )


def say_refused(name: str, number: int, reason: str) -> None:
    log_once(
        log,
        logging.WARNING,
        ("refuse", number, reason),
        "npugraph_ex: %s runs eagerly, not captured: %s",
        name,
        reason,
    )


def say_limit(name: str, number: int, limit: int, captured: int) -> None:
    log_once(
        log,
        logging.WARNING,
        ("limit", number),
        "npugraph_ex: %s reached capture_limit=%d; new shapes run eagerly while the %d "
        "captured ones keep replaying. Raise options={'capture_limit': N} to capture more.",
        name,
        limit,
        captured,
    )


def say_value_keys(name: str, number: int, layout: Any, key: tuple, keys: Iterable[tuple]) -> None:
    """Say once when many of ``keys`` differ from ``key`` only in the values of int inputs (ints
    that are only data left the graph in the ``split_host_ints`` pass; these are baked)."""
    same = layout.without_values(key)
    values = [layout.describe_values(k) for k in keys if layout.without_values(k) == same]
    if len(values) < VALUE_KEYS_NOTICE:
        return
    log_once(
        log,
        logging.WARNING,
        ("value keys", number),
        "npugraph_ex: %s has captured %d keys that differ only in the values of its int "
        "inputs (%s): each new value is a new capture, and only values seen before replay. "
        "These ints reach kernels as ints (a shift, a size, a bound), which a capture holds "
        "as constants; one the model changes on every call makes every call a capture. "
        "Pass it as a tensor where the model allows it (see 'Int inputs' in docs/guide.md).",
        name,
        len(values),
        "; ".join(values),
    )


def say_moved_inputs(
    name: str,
    number: int,
    calls: int,
    shapes: list[tuple[int, ...]],
    seconds: float,
    *,
    copied: bool,
) -> None:
    """Say once when a key has been captured again on ``calls`` calls in a row because a tensor
    the graph writes (of ``shapes``) arrived at a new address each time; ``copied``: the graph
    copies such tensors in and out from now on."""
    then = (
        "From now on this graph copies the tensors it writes into buffers of its own before "
        "each replay and back after it, two copies per call in place of a capture. To save "
        "the copies too, write"
        if copied
        else "Write"
    )
    log_once(
        log,
        logging.WARNING,
        ("moved inputs", number),
        "npugraph_ex: %s was captured again on each of its last %d calls, not replayed: a "
        "tensor it writes in place arrived at a new address every time (it writes tensors of "
        "shapes %s), and a capture writes to the address it was captured with. Each such "
        "call paid a capture (%.1f ms the last time). %s into one tensor kept across calls "
        "(allocate it once, as a static KV cache is), or return the new value instead of "
        "writing it in place.",
        name,
        calls,
        ", ".join("x".join(map(str, shape)) or "scalar" for shape in shapes),
        seconds * 1e3,
        then,
    )
