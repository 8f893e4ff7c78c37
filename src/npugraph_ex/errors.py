"""Typed exceptions raised by npugraph_ex.

Every error the package raises on purpose derives from :class:`NpuGraphExError`, so callers can
catch the whole family at once. Configuration errors also derive from ``ValueError`` (and wrong
types from ``TypeError``), so code written against the builtin exceptions keeps working.
"""

from __future__ import annotations

__all__ = [
    "CaptureError",
    "ConfigError",
    "ConfigTypeError",
    "NpuGraphExError",
    "PassError",
    "ReplacementError",
    "ScopeError",
    "UnsupportedGraphError",
    "first_line",
]


class NpuGraphExError(Exception):
    """Base class of every error npugraph_ex raises on purpose."""


class ConfigError(NpuGraphExError, ValueError):
    """An option has a wrong value, is unknown, or conflicts with another option.

    ``option`` names the flat option at fault when there is exactly one, so that front ends
    with their own spelling of the options (such as the TorchAir-style ``CompilerConfig``) can
    point the user at the name they wrote.
    """

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class ConfigTypeError(ConfigError, TypeError):
    """An option has a value of the wrong type (for example ``1`` where a bool is expected)."""


class PassError(NpuGraphExError):
    """A graph pass raised; the message names the pass so it can be disabled to bisect."""

    def __init__(self, pass_name: str, message: str, source: str | None = None) -> None:
        super().__init__(f"pass '{pass_name}' failed: {message}")
        self.pass_name = pass_name
        self.message = message
        self.source = source
        """The user's source line of the node the pass failed on, where known."""

    def __reduce__(self) -> tuple[type[PassError], tuple[str, str, str | None]]:
        # The default reduction replays ``self.args`` (the formatted text) into ``__init__``,
        # which takes other arguments; rebuild from the parts instead so the error pickles.
        return (type(self), (self.pass_name, self.message, self.source))


class ReplacementError(NpuGraphExError, ValueError):
    """A pattern's replacement computed a value of another dtype, device or shape than what it
    replaced (``passes/replaced_layouts.py``): the pattern pass is dropped for the graph."""


class ScopeError(NpuGraphExError, ValueError):
    """A scope (``npugraph_ex.scope``) was opened with a wrong argument."""


class CaptureError(NpuGraphExError):
    """A graph could not be captured or replayed."""


class DeadlockRiskError(NpuGraphExError):
    """The ranks' graphs call collectives in different orders or shapes (``deadlock_check``)."""


class UnsupportedGraphError(CaptureError):
    """A graph cannot be captured and ``strict_capture=True`` forbids running it eagerly."""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message ("" for an empty one), for one-line reports."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def error_summary(error: BaseException, limit: int | None = None) -> str:
    """``"TypeName: first line"`` of ``error``, the line cut to ``limit`` characters."""
    return f"{type(error).__name__}: {first_line(error)[:limit]}"
