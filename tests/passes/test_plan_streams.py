"""``plan_streams``: where each lane waits for a stream block (the joins it inserts), and the
graphs it refuses before anything runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from npugraph_ex import ops
from npugraph_ex.config import Config
from npugraph_ex.errors import DeadlockRiskError, ScopeError
from npugraph_ex.passes.plan_streams import plan_streams
from npugraph_ex.passes.stream_blocks import find_lanes
from npugraph_ex.scope import (
    limit_core_num,
    npu_create_tagged_event,
    npu_tagged_event_record,
    npu_tagged_event_wait,
    npu_wait_tensor,
    stream,
)
from npugraph_ex.scope.events import RECORD, STREAM_JOIN

READY = npu_create_tagged_event("ready")
DONE = npu_create_tagged_event("done")


def planned(traced, fn, *args) -> list[str]:  # noqa: ANN001
    """The graph's call nodes after the pass, as ``join<block>`` and op names, in order."""
    graph = traced(fn, *args).gm
    plan_streams(graph, [], Config())
    graph.graph.lint()
    names = []
    for node in graph.graph.nodes:
        if node.target is STREAM_JOIN:
            names.append(f"join{node.args[0]}")
        elif node.op == "call_function":
            names.append(getattr(node.target, "__name__", str(node.target)).split(".")[0])
    return names


def used_later(x, w):
    with stream("side"):
        a = x.sin()
    b = (x @ w).relu()  # independent: runs while the block runs
    return a + b


def test_the_main_path_joins_a_block_just_before_using_its_result(traced) -> None:
    names = planned(traced, used_later, torch.randn(4, 4), torch.randn(4, 4))
    assert names == ["scope_enter", "sin", "scope_exit", "mm", "relu", "join0", "add"]


def written_after_read(x):
    with stream("side"):
        a = x.cos()
    x.mul_(2)  # must not overwrite x while the block reads it
    return a


def test_a_write_to_memory_the_block_reads_waits_for_the_block(traced) -> None:
    names = planned(traced, written_after_read, torch.randn(4))
    assert names.index("join0") < names.index("copy_")
    assert names.count("join0") == 1


def two_blocks(x):
    with stream("a"):
        a = x.sin()
    with stream("b"):
        b = a.cos()  # reads block 0 from another lane
    with stream("a"):
        c = x.exp()  # same lane as block 0: in order, no join
    return b + c


def test_a_block_waits_for_another_lane_but_never_for_its_own(traced) -> None:
    names = planned(traced, two_blocks, torch.randn(4))
    block_b = names[names.index("scope_enter", 3) :]
    assert block_b[:3] == ["scope_enter", "join0", "cos"]
    assert names[-4:] == ["join1", "join2", "add", "output"][:3] + names[-1:]


def unused_block(x):
    with stream("side"):
        x.sin()
        y = x.cos()
    return x + 1, y


def test_every_block_is_joined_before_the_output(traced) -> None:
    names = planned(traced, unused_block, torch.randn(4))
    assert names[-1] == "join0"


def recorded_then_waited(x):
    a = x.sin()
    npu_tagged_event_record(READY)
    with stream("side"):
        npu_tagged_event_wait(READY)  # the main path recorded before opening the block: met
        b = x.cos()
        npu_tagged_event_record(DONE)
    npu_tagged_event_wait(DONE)  # the record is in the block: the main path joins it here
    return a + b


def test_a_wait_on_a_record_in_a_block_joins_the_block(traced) -> None:
    names = planned(traced, recorded_then_waited, torch.randn(4))
    assert names.count("join0") == 1
    wait = names.index("tagged_event_wait", names.index("scope_exit"))
    assert names[wait - 1] == "join0"


def waits_for_tensor(x):
    with stream("side"):
        b = x.cos()
    a = npu_wait_tensor(x.sin(), b)
    return a * 2


def test_npu_wait_tensor_joins_the_block_computing_its_dependency(traced) -> None:
    names = planned(traced, waits_for_tensor, torch.randn(4))
    assert names[names.index("depend") - 1] == "join0"


def marked_in_block(x):
    with stream("side"):
        a = x.sin()
        mark = ops.record()
    b = x.cos()  # runs beside the block
    ops.wait([mark])
    return a * 2, b


def test_torchair_s_wait_joins_the_block_of_the_record_it_lists(traced: Callable) -> None:
    graph = traced(marked_in_block, torch.randn(4)).gm
    (mark,) = graph.graph.find_nodes(op="call_function", target=RECORD)
    del mark.meta["val"]  # as a custom pass inserts it: no fake value to find its memory by
    plan_streams(graph, [], Config())
    names = [str(n.target).split(".")[1] for n in graph.graph.nodes if n.op == "call_function"]
    assert names[names.index("cos") :] == ["cos", "stream_join", "wait", "mul"]


def kept_for_its_tag(x):
    with stream("side"):
        a = x.sin()
    torch.ops.npugraph_ex.record_tagged_stream(a, "side")  # reads nothing for the plan
    b = x.cos()
    return a + b


def test_record_tagged_stream_never_waits(traced) -> None:
    names = planned(traced, kept_for_its_tag, torch.randn(4))
    assert names == [
        "scope_enter",
        "sin",
        "scope_exit",
        "record_tagged_stream",
        "cos",
        "join0",
        "add",
    ]


def never_recorded(x):
    with stream("side"):
        npu_tagged_event_wait(READY)
        return x.sin()


def waits_before_record(x):
    with stream("side"):
        npu_tagged_event_wait(READY)
        y = x.sin()
    npu_tagged_event_record(READY)
    return y


def crossed_waits(x):
    with stream("a"):
        npu_tagged_event_wait(DONE)
        y = x.sin()
        npu_tagged_event_record(READY)
    with stream("b"):
        npu_tagged_event_wait(READY)
        z = x.cos()
        npu_tagged_event_record(DONE)
    return y + z


def limited_in_block(x):
    with stream("a"):
        with limit_core_num(1, 1):
            return x.sin()


def limited_in_inner_block(x):
    with stream("a"):
        y = x.cos()
        with stream("b"):
            with limit_core_num(1, 1):
                y = y + x.sin()
    return y


@pytest.mark.parametrize(
    ("fn", "error", "pieces"),
    [
        (never_recorded, ScopeError, ["tag 'ready'", "is never recorded", "in never_recorded"]),
        (
            waits_before_record,
            ScopeError,
            ["has no record of the tag before it", "comes after it", "record the event first"],
        ),
        (
            crossed_waits,
            DeadlockRiskError,
            [
                "stream blocks wait on each other and would never finish",
                "stream 'a' waits for 'done'",
                "recorded by stream 'b'",
                "stream 'b' waits for 'ready'",
                "recorded by stream 'a'",
            ],
        ),
        (limited_in_block, ScopeError, ["limit_core_num", "inside stream block 'a'", "outside"]),
        (
            limited_in_inner_block,
            ScopeError,
            ["limit_core_num", "inside stream block 'b'", "around the stream block"],
        ),
    ],
)
def test_graphs_that_would_hang_or_cannot_run_are_refused(traced, fn, error, pieces) -> None:  # noqa: ANN001
    with pytest.raises(error) as raised:
        planned(traced, fn, torch.randn(4))
    for piece in pieces:
        assert piece in str(raised.value)


def nested(x):
    with stream("outer"):
        a = x.sin()
        with stream("inner"):
            b = a.cos()  # reads the outer block's first part
        c = b.exp()  # the outer tag again, after the inner block
    return c + a


def test_a_nested_block_is_split_into_blocks_side_by_side(traced) -> None:
    names = planned(traced, nested, torch.randn(4))
    assert names == [
        *["scope_enter", "sin", "scope_exit"],  # block 0: "outer" up to the inner block
        *["scope_enter", "join0", "cos", "scope_exit"],  # block 1: "inner"
        *["scope_enter", "join1", "exp", "scope_exit"],  # block 2: "outer" again
        *["join0", "join2", "add", "join1"],  # the main path joins what it reads, then the rest
    ]


def waits_in_inner_for_outer(x):
    with stream("outer"):
        a = x.sin()
        npu_tagged_event_record(READY)
        with stream("inner"):
            npu_tagged_event_wait(READY)  # recorded in the outer block's first part
            b = x.cos()
    return a + b  # the outer block has nothing after the inner one: no empty part is left


def test_a_wait_in_an_inner_block_joins_the_outer_block_s_record(traced: Callable) -> None:
    names = planned(traced, waits_in_inner_for_outer, torch.randn(4))
    assert names == [
        *["scope_enter", "sin", "tagged_event_record", "scope_exit"],
        *["scope_enter", "join0", "tagged_event_wait", "cos", "scope_exit"],
        *["join0", "join1", "add"],
    ]


def tags_of(traced: Callable, fn: Callable, *args: torch.Tensor) -> dict[str, str]:
    """The tag of the lane each op of the planned graph runs on ("main" for the main path)."""
    graph = traced(fn, *args).gm.graph
    plan_streams(torch.fx.GraphModule({}, graph), [], Config())
    lanes = find_lanes(graph)
    return {
        node.name: "main" if lanes.block_of[node] is None else lanes.block_of[node].tag
        for node in graph.nodes
        if node.op == "call_function" and getattr(node.target, "namespace", "") == "aten"
    }


def three_deep(x):
    a = x.neg()
    with stream("a"):
        b = a.sin()
        with stream("b"):
            c = b.cos()
            with stream("c"):
                d = x.exp()
            e = c * 2  # "b" again
        f = b + 1  # "a" again
    return f + e + d


def test_each_node_runs_on_the_innermost_block_open_around_it(traced) -> None:
    tags = tags_of(traced, three_deep, torch.randn(4))
    assert tags == {
        "neg": "main",
        "sin": "a",
        "cos": "b",
        "exp": "c",
        "mul": "b",
        "add": "a",
        "add_1": "main",
        "add_2": "main",
    }


@pytest.fixture
def one_rank_group():
    """A gloo group of one process: enough to trace collectives."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def reductions_on_two_lanes(x):
    import torch.distributed as dist

    y, z = x * 2, x * 3
    with stream("comm"):
        dist.all_reduce(y)
    w = x.sin()  # no collective: runs beside the block
    dist.all_reduce(z)  # same group as the block's: issued after it
    return y + z + w


def test_collectives_of_one_group_keep_program_order_across_lanes(traced, one_rank_group) -> None:
    names = planned(traced, reductions_on_two_lanes, torch.randn(4))
    main_reduce = names.index("all_reduce", names.index("scope_exit"))
    assert names[main_reduce - 1] == "join0"
    assert names.index("sin") < names.index("join0")


def test_a_block_left_open_is_joined_before_the_output(traced) -> None:
    from npugraph_ex.scope.ops import SCOPE_ENTER, SCOPE_EXIT

    graph = traced(unused_block, torch.randn(4)).gm
    exits = graph.graph.find_nodes(op="call_function", target=SCOPE_EXIT)
    for node in exits:  # as a custom pass might leave it: the block never closes
        graph.graph.erase_node(node)
    assert graph.graph.find_nodes(op="call_function", target=SCOPE_ENTER)
    plan_streams(graph, [], Config())
    *_, join, output = graph.graph.nodes
    assert join.target is STREAM_JOIN and join.args[0] == 0 and output.op == "output"
