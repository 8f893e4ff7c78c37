"""One-line error reports (fallback warnings, the bench's failed variants)."""

from __future__ import annotations

from npugraph_ex.errors import error_summary, first_line


def test_first_line_keeps_only_the_first_line() -> None:
    assert first_line(RuntimeError("\n  no fake impl\nhint: register_fake\n")) == "no fake impl"


def test_first_line_of_an_empty_message_is_empty() -> None:
    assert first_line(RuntimeError()) == ""


def test_an_error_summary_names_the_type_and_cuts_the_first_line() -> None:
    # An empty message (Inductor raises bare AssertionErrors) must not fail the report itself.
    assert error_summary(AssertionError()) == "AssertionError: "
    assert error_summary(ValueError("abcdef\nmore"), 3) == "ValueError: abc"
