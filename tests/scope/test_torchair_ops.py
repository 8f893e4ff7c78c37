"""TorchAir's ordering ops under ``torch.ops.npugraph_ex`` (``record``/``wait``, tagged events,
``record_tagged_stream``), as its custom-pass recipes insert them, and ``npugraph_ex.ops``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from helpers import counts
from npugraph_ex import ops
from npugraph_ex.errors import ScopeError
from npugraph_ex.scope import stream

TORCHAIR_SCHEMAS = {
    "tagged_event_record": "tagged_event_record(str tag, bool created_inside=False) -> ()",
    "tagged_event_wait": "tagged_event_wait(str tag, bool created_inside=False) -> ()",
    "record": "record(*, Device? device=None) -> Tensor",
    "wait": "wait(Tensor[] x) -> ()",
    "record_tagged_stream": "record_tagged_stream(Tensor input, str tag) -> ()",
    "record_tagged_stream_": "record_tagged_stream_(Tensor(a!) input, str tag) -> ()",
    "scope_enter": "scope_enter(str[] keys, str[] values, bool need_execute=False) -> ()",
    "scope_exit": "scope_exit(bool need_execute=False) -> ()",
}
"""The schemas TorchAir defines these ops with (its ``lib.define`` strings)."""


@pytest.mark.parametrize("name", sorted(TORCHAIR_SCHEMAS))
def test_the_ops_have_torchair_s_schemas(name: str) -> None:
    op = getattr(torch.ops.npugraph_ex, name).default
    assert str(op._schema) == f"npugraph_ex::{TORCHAIR_SCHEMAS[name]}"


def model(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mm = torch.mm(x, x)
    abs_res = torch.abs(mm)
    add = torch.add(abs_res, 1)
    sub = torch.sub(x, mm)
    return add, sub


def record_wait_recipe(gm: torch.fx.GraphModule, example_inputs: object, config: object) -> None:
    """TorchAir's documented custom pass: ``mm`` and ``abs`` on stream "stream_1", a ``record``
    after ``abs``, and ``sub`` after a ``wait`` on it."""
    graph = gm.graph
    record_node = None
    for node in list(graph.nodes):
        if node.target == torch.ops.aten.mm.default:
            with graph.inserting_before(node):
                graph.call_function(
                    torch.ops.npugraph_ex.scope_enter.default,
                    (["_user_stream_label"], ["stream_1"]),
                )
        if node.target == torch.ops.aten.abs.default:
            with graph.inserting_after(node):
                record_node = graph.call_function(torch.ops.npugraph_ex.record.default, ())
            with graph.inserting_after(record_node):
                graph.call_function(torch.ops.npugraph_ex.scope_exit.default, ())
        if node.target == torch.ops.aten.sub.Tensor:
            with graph.inserting_before(node):
                graph.call_function(torch.ops.npugraph_ex.wait.default, ([record_node],))
    gm.recompile()


def tagged_event_closure(gm: torch.fx.GraphModule, example_inputs: object, config: object) -> None:
    """TorchAir's closure of a stream block with events it creates itself (``created_inside``):
    a record at the start waited on inside the block, a record at the block's end waited on
    before the output, and the block's input kept for its tag (``record_tagged_stream``)."""
    graph = gm.graph
    first = next(iter(graph.nodes))
    (mm,) = graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default)
    (abs_node,) = graph.find_nodes(op="call_function", target=torch.ops.aten.abs.default)
    ops_ = torch.ops.npugraph_ex
    with graph.inserting_after(first):
        graph.call_function(ops_.tagged_event_record.default, ("g0_enter", True))
    with graph.inserting_before(mm):
        graph.call_function(ops_.record_tagged_stream.default, (mm.args[0], "stream_1"))
        graph.call_function(ops_.scope_enter.default, (["_user_stream_label"], ["stream_1"]))
        graph.call_function(ops_.tagged_event_wait.default, ("g0_enter", True))
    with graph.inserting_after(abs_node):
        exit_node = graph.call_function(ops_.scope_exit.default, ())
    with graph.inserting_before(exit_node):
        graph.call_function(
            ops_.tagged_event_record.default, ("g0_exit",), {"created_inside": True}
        )
    with graph.inserting_before(graph.output_node()):
        graph.call_function(ops_.tagged_event_wait.default, ("g0_exit", True))
    gm.recompile()


@pytest.mark.parametrize(
    "custom_pass", [record_wait_recipe, tagged_event_closure], ids=["record-wait", "tagged-events"]
)
@torch.no_grad()
def test_a_custom_pass_inserting_the_ops_replays_eager_results(custom_pass: Callable) -> None:
    compiled = torch.compile(
        model, backend="npugraph_ex", options={"post_grad_custom_pre_pass": custom_pass}
    )
    for _ in range(3):
        x = torch.randn(5, 5)
        for actual, expected in zip(compiled(x), model(x), strict=True):
            assert torch.equal(actual, expected)
    assert counts()["captures"] == 1 and counts()["replays"] == 2
    assert counts()["eager_calls"] == 0


def marked_and_waited(x: torch.Tensor) -> torch.Tensor:
    side = ops.npu_create_tagged_event("torchair_ops_side")
    with stream("side"):
        a = x.mm(x).abs()
        mark = ops.record()
        ops.npu_tagged_event_record(side)
    ops.npu_record_tagged_stream(a, "side")
    ops.wait([mark])
    ops.npu_tagged_event_wait(side)
    return a + 1


@torch.no_grad()
def test_the_ops_module_s_functions_order_blocks_in_compiled_code() -> None:
    compiled = torch.compile(marked_and_waited, backend="npugraph_ex", fullgraph=True)
    for _ in range(3):
        x = torch.randn(6, 6)
        assert torch.equal(compiled(x), marked_and_waited(x))
    assert counts()["replays"] == 2 and counts()["eager_calls"] == 0


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ([], "npugraph_ex.ops.wait takes a non-empty list of tensors (from record()), got []"),
        ([torch.ones(1), 2], "npugraph_ex.ops.wait takes tensors only (from record()), got int"),
    ],
    ids=["empty", "not a tensor"],
)
def test_wait_refuses_what_it_cannot_wait_for(tensors: list, message: str) -> None:
    with pytest.raises(ScopeError) as raised:
        ops.wait(tensors)
    assert str(raised.value).startswith(message)
