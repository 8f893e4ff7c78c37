"""One-line error reports (fallback warnings, the bench's failed variants)."""

from __future__ import annotations

from npugraph_ex.errors import first_line


def test_first_line_keeps_only_the_first_line() -> None:
    assert first_line(RuntimeError("\n  no fake impl\nhint: register_fake\n")) == "no fake impl"


def test_first_line_of_an_empty_message_is_empty() -> None:
    assert first_line(RuntimeError()) == ""
