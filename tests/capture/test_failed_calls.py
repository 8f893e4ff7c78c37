"""A call that raises fails alone: the graph goes on capturing, replaying and counting."""

from __future__ import annotations

import pytest
import torch

from helpers import graphs_called, totals


@torch.no_grad()
@pytest.mark.parametrize("strict", [False, True])
def test_an_out_of_range_index_fails_that_call_only(strict: bool) -> None:
    embedding = torch.nn.Embedding(10, 4)
    fn = torch.compile(
        embedding, backend="npugraph_ex", dynamic=True, options={"strict_capture": strict}
    )
    fn(torch.tensor([1, 2]))
    with pytest.raises(IndexError, match="index out of range"):
        fn(torch.tensor([1, 2, 30]))  # a new shape whose capture fails on the data
    for ids in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        tokens = torch.tensor(ids)
        assert torch.equal(fn(tokens), embedding(tokens))
    (graph,) = graphs_called()
    assert graph["captures"] == 2
    assert graph["replays"] == 2
    assert graph["eager_calls"] == {"capture failed": 1}
    assert graph["failed_calls"] == {"capture failed": 1}


@torch.no_grad()
def test_an_out_of_range_index_on_a_replay_fails_that_replay_only() -> None:
    embedding = torch.nn.Embedding(10, 4)
    fn = torch.compile(embedding, backend="npugraph_ex", dynamic=True)
    fn(torch.tensor([1, 2]))
    with pytest.raises(IndexError, match="index out of range"):
        fn(torch.tensor([1, 30]))
    tokens = torch.tensor([3, 4])
    assert torch.equal(fn(tokens), embedding(tokens))
    assert totals()["replays"] == 1
    assert totals()["failed_calls"] == 1
    (graph,) = graphs_called()
    assert graph["failed_calls"] == {"replay": 1}
