"""The device-graph runtimes' output copy-out (``runtime.cuda.private_copies``), on CPU tensors.

A CUDA or NPU capture after the first in a shared pool moves its outputs into storages of their
own, so that another key's replay never rewrites them. The bookkeeping is plain storage and view
arithmetic, the same on every device, so it is checked here where every test runs.
"""

from __future__ import annotations

import torch

from npugraph_ex.runtime.output_copies import private_copies


def copy_out(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """What the second captured graph does on every replay."""
    for source, own in pairs:
        own.copy_(source)


def layout(tensor: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    return tensor.storage_offset(), tensor.stride()


def test_outputs_move_to_storages_of_their_own_keeping_their_views() -> None:
    pooled = torch.arange(12.0)
    row, column = pooled.view(3, 4)[1], pooled.view(3, 4)[:, 2]  # two views of one storage
    other = torch.full((2, 2), 7.0)
    moved, pairs = private_copies([row, column, other], inputs=[])
    assert len(pairs) == 2  # one copy per storage, not per output
    copy_out(pairs)
    for before, after in zip([row, column, other], moved, strict=True):
        assert torch.equal(after, before)
        assert after.untyped_storage().data_ptr() != before.untyped_storage().data_ptr()
        assert layout(after) == layout(before)
    assert moved[0].untyped_storage().data_ptr() == moved[1].untyped_storage().data_ptr()
    pooled.fill_(-1.0)  # another key's replay reusing the pool's bytes
    assert torch.equal(moved[0], torch.tensor([4.0, 5.0, 6.0, 7.0]))
    copy_out(pairs)  # the next replay of this key refreshes its outputs
    assert torch.equal(moved[1], torch.full((3,), -1.0))


def test_outputs_aliasing_an_input_empty_ones_and_non_tensors_stay_as_they_are() -> None:
    cache = torch.zeros(4, 8)
    view_of_input, empty = cache[1:3], torch.empty(0)
    moved, pairs = private_copies([view_of_input, empty, 5], inputs=[cache, 3])
    assert pairs == []
    assert moved[0] is view_of_input and moved[1] is empty and moved[2] == 5
