"""What a device graph hands its caller (``runtime.handed_out``), on CPU tensors.

The aliasing and the "does the caller still hold it" bookkeeping are the same on every device,
so they are checked here; the hook that makes a storage unreadable exists only in torch builds
with CUDA, so a recorder of the storages it would mark stands in for it (the CUDA tests read
the real error).
"""

from __future__ import annotations

import gc
import logging

import pytest
import torch

from npugraph_ex.debug import once
from npugraph_ex.runtime import handed_out
from npugraph_ex.runtime.handed_out import HELD_OVERWRITTEN, OVERWRITTEN, HandedOut


@pytest.fixture
def marked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Addresses of the storages made unreadable, in order."""
    addresses: list[int] = []

    def record(storage: torch.UntypedStorage, message: str) -> None:
        assert message == OVERWRITTEN
        addresses.append(storage.data_ptr())

    monkeypatch.setattr(handed_out, "MARK_UNREADABLE", record)
    monkeypatch.setattr(HandedOut, "lingering", [])
    return addresses


def test_the_caller_gets_aliases_on_storages_of_its_own(marked: list[int]) -> None:
    graph_memory = torch.arange(12.0)
    row, column = graph_memory.view(3, 4)[1], graph_memory.view(3, 4)[:, 2]
    cache = torch.zeros(2, 2)
    view_of_input = cache[0]
    aliases = HandedOut(inputs=[cache]).hand_out([row, column, view_of_input, 7])
    for alias, output in zip(aliases[:2], (row, column), strict=True):
        assert torch.equal(alias, output) and alias.data_ptr() == output.data_ptr()
        assert alias.stride() == output.stride() and alias is not output
    shared = {a.untyped_storage()._cdata for a in aliases[:2]}
    assert len(shared) == 1  # views of one output storage stay views of one storage
    assert shared != {graph_memory.untyped_storage()._cdata}
    assert aliases[2] is view_of_input and aliases[3] == 7  # the caller's own, passed through


def test_only_what_the_caller_still_holds_is_made_unreadable(marked: list[int]) -> None:
    first_output, second_output = torch.ones(4), torch.zeros(3)
    handed = HandedOut(inputs=[])
    held, dropped = handed.hand_out([first_output, second_output])
    row = held[1:]  # a view the caller made
    del dropped, held
    handed.before_replay()
    assert marked == [first_output.data_ptr()]  # ``row`` still holds the first storage
    del row
    handed.hand_out([first_output, second_output])  # dropped at once
    handed.before_replay()
    assert marked == [first_output.data_ptr()]


def test_a_released_graph_keeps_its_outputs_while_the_caller_holds_them(
    marked: list[int],
) -> None:
    output = torch.full((4,), 3.0)
    handed = HandedOut(inputs=[])
    (held,) = handed.hand_out([output])
    handed.release([output])
    ((storages, owners),) = HandedOut.lingering
    assert len(storages) == 1 and owners[0] is output
    del held
    gc.collect()
    HandedOut(inputs=[]).release([])  # the next release lets go of what nobody holds
    assert HandedOut.lingering == []
    assert marked == []  # a release overwrites nothing


def test_without_the_hook_a_held_output_overwritten_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(handed_out, "MARK_UNREADABLE", None)
    monkeypatch.setattr(once, "SEEN", set())
    output = torch.ones(2)
    handed = HandedOut(inputs=[])
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        handed.hand_out([output])  # dropped at once
        handed.before_replay()
        assert caplog.records == []
        for _ in range(3):
            (held,) = handed.hand_out([output])
            assert held.data_ptr() == output.data_ptr() and held is not output
            handed.before_replay()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning == HELD_OVERWRITTEN and "options={'clone_output': True}" in warning
