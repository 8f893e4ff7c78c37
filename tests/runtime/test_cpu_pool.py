"""CPU pools: captures sharing one arena and output slots, and outputs a caller still holds."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils import _pytree as pytree

from helpers import capture_on_cpu
from npugraph_ex.runtime.cpu import views as cpu_views
from npugraph_ex.runtime.cpu.pool import CpuPool


def capture(fn, *args, pool, disabled=()):
    # The Capture's outputs are the capturing call's: dropped here, as once a call returned.
    return capture_on_cpu(fn, *args, pool=pool, disabled=disabled)


def mlp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return ((x @ w).relu() @ w.t()).sigmoid() + x


def shapes(*rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    w = torch.randn(32, 128)
    return [(torch.randn(n, 32), w) for n in rows]


def test_captures_in_one_pool_take_the_largest_arena_not_the_sum() -> None:
    pool = CpuPool()
    graphs = [capture(mlp, x, w, pool=pool) for x, w in shapes(4, 64, 16)]
    arenas = [g.placed.arena_bytes for g in graphs]
    assert pool.arena.nbytes() == max(arenas) < sum(arenas)
    # One output slot, sized by the largest output seen while nobody held the smaller ones.
    assert len(pool.slots) == 1
    assert pool.nbytes == pool.arena.nbytes() + pool.slots[0].storage.nbytes()


def test_every_capture_in_a_shared_pool_replays_correctly_in_any_order() -> None:
    pool = CpuPool()
    cases = shapes(4, 64, 16, 1)
    graphs = [capture(mlp, x, w, pool=pool) for x, w in cases]
    for index in [3, 0, 2, 2, 1, 0, 3, 1]:
        x, w = cases[index]
        x.copy_(torch.randn_like(x))
        assert torch.equal(graphs[index].replay()[0], mlp(x, w))


def test_an_older_keys_output_the_caller_holds_is_never_overwritten() -> None:
    pool = CpuPool()
    (small_x, w), (big_x, _) = shapes(4, 64)
    small, big = capture(mlp, small_x, w, pool=pool), capture(mlp, big_x, w, pool=pool)
    big.replay()  # the slot now has room for either key's output
    held = small.replay()[0]
    kept = held.clone()
    row = held[1]  # a view the caller made
    big_x.copy_(torch.randn_like(big_x))
    fresh = big.replay()[0]  # another key: needs the slot the held output sits in
    assert torch.equal(held, kept) and torch.equal(row, kept[1])
    assert torch.equal(fresh, mlp(big_x, w))
    assert fresh.untyped_storage().data_ptr() != held.untyped_storage().data_ptr()


def test_memory_nobody_holds_is_reused_across_keys() -> None:
    pool = CpuPool()
    (small_x, w), (big_x, _) = shapes(4, 64)
    small, big = capture(mlp, small_x, w, pool=pool), capture(mlp, big_x, w, pool=pool)
    address = big.replay()[0].data_ptr()  # dropped at once
    gc.collect()
    assert small.replay()[0].data_ptr() == address  # same slot storage, not a new allocation
    assert torch.equal(small.replay()[0], mlp(small_x, w))


def test_the_same_key_rewrites_its_outputs_in_place_once_the_caller_drops_them() -> None:
    pool = CpuPool()
    ((x, w),) = shapes(8)
    graph = capture(mlp, x, w, pool=pool)
    address = graph.replay()[0].data_ptr()  # dropped at once
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        output = graph.replay()[0]
        assert output.data_ptr() == address  # no new memory
        assert torch.equal(output, mlp(x, w))
        del output


def test_the_same_key_leaves_an_output_the_caller_holds_to_the_caller() -> None:
    pool = CpuPool()
    ((x, w),) = shapes(8)
    graph = capture(mlp, x, w, pool=pool)
    first = graph.replay()[0]
    kept, row = first.clone(), first[2]  # the output and a view the caller made of it
    x.copy_(torch.randn_like(x))
    second = graph.replay()[0]
    assert torch.equal(first, kept) and torch.equal(row, kept[2])  # as eager: its own values
    assert torch.equal(second, mlp(x, w))
    assert second.data_ptr() != first.data_ptr()
    del first, row
    kept = second.clone()
    x.copy_(torch.randn_like(x))
    third = graph.replay()[0]  # ``second`` is still held: fresh memory again
    assert torch.equal(second, kept) and third.data_ptr() != second.data_ptr()
    assert torch.equal(third, mlp(x, w))


def test_a_released_capture_gives_its_slot_up() -> None:
    pool = CpuPool()
    (x, w), (other_x, _) = shapes(4, 8)
    graph, other = capture(mlp, x, w, pool=pool), capture(mlp, other_x, w, pool=pool)
    assert pool.slots[0].writer is other.placed
    other.release()
    assert pool.slots[0].writer is None
    assert torch.equal(graph.replay()[0], mlp(x, w))


def test_a_smaller_capture_after_a_larger_one_keeps_the_larger_slot() -> None:
    pool = CpuPool()
    (big_x, w), (small_x, _) = shapes(64, 4)
    big = capture(mlp, big_x, w, pool=pool)
    small = capture(mlp, small_x, w, pool=pool)  # its output is copied into the larger slot
    assert pool.slots[0].storage.nbytes() == 64 * 32 * 4
    for x, graph in ((small_x, small), (big_x, big), (small_x, small)):
        x.copy_(torch.randn_like(x))
        assert torch.equal(graph.replay()[0], mlp(x, w))
    assert pool.slots[0].storage.nbytes() == 64 * 32 * 4  # replays needed no new memory


def repeated_blocks(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Four blocks of the same shapes: their intermediates reuse the arena at equal offsets."""
    for _ in range(4):
        x = torch.sigmoid(x @ w) * 2 + x
    return x


def tensors_viewing(graph, storage: torch.UntypedStorage) -> list[torch.Tensor]:
    """The tensors the steps of ``graph`` pass that view ``storage``, each time they pass one."""
    return [
        t
        for _, args, kwargs in graph.steps
        for t in pytree.tree_leaves((args, kwargs))
        if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata == storage._cdata
    ]


def tensor_objects(graph, storage: torch.UntypedStorage) -> set[int]:
    """The tensor objects the steps of ``graph`` pass that view ``storage``."""
    return {id(t) for t in tensors_viewing(graph, storage)}


def test_views_of_the_arena_with_one_geometry_share_one_tensor_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = torch.randn(16, 16)
    shared = capture(repeated_blocks, torch.randn(8, 16), w, pool=CpuPool())
    apart = capture(
        repeated_blocks, torch.randn(8, 16), w, pool=CpuPool(), disabled=("share_views",)
    )
    arena_objects = {len(tensor_objects(g, g.placed.pool.arena)) for g in (shared, apart)}
    # Four blocks of mm, sigmoid, mul and add: 16 results, the last one the output, so 15 in
    # the arena, where they take three places of one shape.
    assert arena_objects == {3, 15}


def reshaped_blocks(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Views of intermediates between the products."""
    h = (x @ w).view(-1).sigmoid()
    return (h.view(x.shape).t().contiguous().t() @ w.t()) + x


def bases_in_arena(graph) -> int:
    return sum(t._base is not None for t in tensors_viewing(graph, graph.placed.pool.arena))


def test_views_of_the_arena_are_bound_without_their_base(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(16, 16)
    x = torch.randn(8, 16)
    bare = capture(reshaped_blocks, x, w, pool=CpuPool())
    monkeypatch.setattr(cpu_views, "without_base", lambda view: view)
    kept = capture(reshaped_blocks, x, w, pool=CpuPool())
    assert (bases_in_arena(bare), bases_in_arena(kept) > 0) == (0, True)
    x.copy_(torch.randn_like(x))
    assert torch.equal(bare.replay()[0], reshaped_blocks(x, w))


def test_shared_tensor_objects_replay_every_key_of_a_pool_correctly() -> None:
    pool = CpuPool()
    w = torch.randn(16, 16)
    cases = [torch.randn(rows, 16) for rows in (8, 64, 1)]  # the arena grows at the second
    graphs = [capture(repeated_blocks, x, w, pool=pool) for x in cases]
    for index in [0, 2, 1, 0, 1, 2, 2]:
        x = cases[index]
        x.copy_(torch.randn_like(x))
        assert torch.equal(graphs[index].replay()[0], repeated_blocks(x, w))


def test_every_capture_passes_one_object_per_view_of_a_weight() -> None:
    pool = CpuPool()
    cases = shapes(4, 16)  # one weight
    w = cases[0][1]
    graphs = [capture(mlp, x, weight, pool=pool) for x, weight in cases]
    views = [tensor_objects(g, w.untyped_storage()) for g in graphs]
    assert len(views[0]) == 2  # the weight and its transpose
    assert views[0] == views[1]
    for index in [1, 0, 1]:
        x, _ = cases[index]
        x.copy_(torch.randn_like(x))
        assert torch.equal(graphs[index].replay()[0], mlp(x, w))


def test_output_views_are_never_shared() -> None:
    pool = CpuPool()
    graphs = [capture(mlp, x, w, pool=pool) for x, w in shapes(4, 4)]  # one shape, two keys
    # Each capture's last step writes its own output object, re-pointed at each key switch.
    written = [g.steps[-1][2]["out"] for g in graphs]
    assert [w is g.outputs[0] for w, g in zip(written, graphs, strict=True)] == [True, True]
    assert written[0] is not written[1]
