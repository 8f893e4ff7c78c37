"""The documents users read first stay true to the code."""

from __future__ import annotations

from pathlib import Path

import pytest

from npugraph_ex.config import OPTION_NAMES
from npugraph_ex.passes.pipeline import PIPELINE

ROOT = Path(__file__).resolve().parents[1]


def test_readme_starts_with_the_two_setup_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[1].startswith("make demo")
    assert lines[2].startswith("make test")


@pytest.mark.parametrize("name", OPTION_NAMES)
def test_every_option_is_in_the_reference(name: str) -> None:
    assert f"| `{name}`" in (ROOT / "docs" / "options.md").read_text()


def test_the_reference_lists_the_pass_names() -> None:
    text = (ROOT / "docs" / "options.md").read_text()
    for graph_pass in PIPELINE:
        assert f"`{graph_pass.name}`" in text
