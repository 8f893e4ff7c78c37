"""CPU memory planning: lifetimes, arena offsets, and aliasing kept through the move."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils import _pytree as pytree

from helpers import capture_on_cpu as capture
from helpers import captured_on_cpu
from npugraph_ex.runtime.cpu.memory import ALIGNMENT, Buffer, assign_offsets
from npugraph_ex.runtime.tensors import tensors_in


def overlap_in_bytes(a: Buffer, b: Buffer) -> bool:
    return a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


def test_buffers_live_together_never_share_bytes_and_dead_ones_do() -> None:
    rng = random.Random(0)
    buffers = []
    for _ in range(200):
        first = rng.randrange(50)
        buffers.append(Buffer(rng.randrange(1, 5000), first, first + rng.randrange(6)))
    size = assign_offsets(buffers)
    for i, a in enumerate(buffers):
        assert a.offset % ALIGNMENT == 0
        assert a.offset + a.nbytes <= size
        for b in buffers[i + 1 :]:
            if a.overlaps_in_time(b):
                assert not overlap_in_bytes(a, b)
    assert size < sum(b.nbytes for b in buffers) / 2


def test_a_step_never_writes_bytes_it_reads() -> None:
    # Lifetimes are closed intervals: an input last read at step 3 and an output first written
    # at step 3 are live together.
    read, written = Buffer(256, 0, 3), Buffer(256, 3, 5)
    assign_offsets([read, written])
    assert not overlap_in_bytes(read, written)


def chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(6):
        x = (x * 2).relu() + 1
    return x


def test_a_chain_of_kernels_needs_two_intermediates_not_one_per_kernel() -> None:
    x = torch.randn(64, 64)
    graph = capture(chain, x)
    buffer = 64 * 64 * 4
    assert graph.kernel_count == 18
    # 17 intermediates of one size; at most two are live at once, the output has a slot.
    assert graph.placed.arena_bytes == 2 * buffer
    assert graph.pool_bytes == 3 * buffer
    x.copy_(torch.randn(64, 64))
    assert torch.equal(graph.replay()[0], chain(x))


def views_and_in_place(x: torch.Tensor, w: torch.Tensor):
    h = x @ w
    rows = h[1:]
    rows.add_(1)  # in place through a view of an intermediate
    scaled = rows * 3
    scaled.t().mul_(2)  # in place through a transposed view
    return h.relu(), rows.t(), scaled[:, :2], h.sum()


def test_views_and_in_place_writes_keep_their_aliasing_in_the_arena() -> None:
    x, w = torch.randn(5, 8), torch.randn(8, 6)
    graph = capture(views_and_in_place, x, w)
    for _ in range(3):
        x.copy_(torch.randn(5, 8))
        got = graph.replay()
        for actual, expected in zip(got, views_and_in_place(x, w), strict=True):
            assert torch.equal(actual, expected)
    relu, rows_t, scaled, _ = got
    # rows.t() views h: the output keeps h's whole storage, geometry unchanged.
    assert rows_t.stride() == (1, 6) and rows_t.storage_offset() == 6
    assert rows_t.untyped_storage().nbytes() == 5 * 6 * 4
    assert scaled.stride() == (6, 1)
    assert relu.untyped_storage().data_ptr() != rows_t.untyped_storage().data_ptr()


def test_capture_under_inference_mode_replays_outside_it() -> None:
    x = torch.randn(16, 16)
    with torch.inference_mode():
        graph = capture(chain, x)
    other = capture(chain, torch.randn(8, 16), pool=graph.placed.pool)  # takes the first's slot
    other.replay()
    x.copy_(torch.randn(16, 16))
    with torch.no_grad():
        assert torch.equal(graph.replay()[0], chain(x))


@pytest.mark.parametrize("pooled", [True, False])
def test_the_capturing_call_returns_values_in_the_graphs_output_memory(pooled) -> None:
    x = torch.randn(4, 4)
    captured = captured_on_cpu(chain, x, disabled=() if pooled else ("place",))
    first, graph = captured.outputs[0], captured.graph
    assert torch.equal(first, chain(x))
    address = first.data_ptr()
    del first, captured  # nobody holds the output now: the replay rewrites it in place
    assert graph.replay()[0].data_ptr() == address
    assert (graph.placed is not None) == pooled


def test_tensors_in_finds_what_pytree_finds_in_the_same_order() -> None:
    a, b, c = torch.ones(1), torch.zeros(2), torch.full((3,), 2.0)
    values = [
        a,
        (a, 1, None, [b, (c,)]),
        {"out": a, "others": [b, 2.5], "none": None},
        torch.max(torch.randn(3, 4), dim=1),  # a named tuple of two tensors
        ((), [], {}, "text", torch.Size([2, 3])),
    ]
    for value in values:
        want = [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]
        got = tensors_in(value)
        assert len(got) == len(want)
        assert all(x is y for x, y in zip(got, want, strict=True))
