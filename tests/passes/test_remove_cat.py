"""remove_cat_ops: producers made only for a cat write straight into its result."""

from __future__ import annotations

import operator

import pytest
import sympy
import torch
from torch._dynamo.utils import counters

import npugraph_ex
from helpers import assert_trees_equal, graphs_called, kernels_per_replay
from npugraph_ex.config import Config
from npugraph_ex.passes.graph_facts import fake_value
from npugraph_ex.passes.remove_cat import SizeNodes, remove_cat_ops

aten = torch.ops.aten


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """As Hugging Face rotary embeddings write it."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1) * 2


def two_products(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.cat([x @ w, (x @ v).relu()], dim=0).sum(0)


def shared_producer(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.sin()
    return torch.cat([s, x.cos()]), s * 2  # s is needed on its own: only cos writes in place


def only_views(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:2], x[2:]]) + 1  # nothing is made for the cat: nothing to save


def promoted(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.cat([x.sin(), i.abs()])  # cat promotes the int part: abs may not write a float


def appended_to_empty(x: torch.Tensor) -> torch.Tensor:
    # An empty 1-d tensor is how a cache starts out; cat skips it whatever the other parts' dims.
    return torch.cat([torch.tensor([]), x.neg()], dim=-2)


def test_a_producer_writes_its_slice_and_the_rest_is_copied(traced) -> None:
    graph = traced(rotate_half, torch.randn(2, 4, 1, 8))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0 and counts["aten.neg.default"] == 0
    assert counts["aten.neg.out"] == 1 and counts["aten.copy_.default"] == 1


def test_every_producer_made_for_the_cat_writes_in_place(traced) -> None:
    graph = traced(two_products, torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 5))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0 and counts["aten.copy_.default"] == 0
    assert counts["aten.mm.out"] == 1 and counts["aten.relu.out"] == 1


def test_a_producer_with_other_users_is_copied(traced) -> None:
    graph = traced(shared_producer, torch.randn(4))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.sin.default"] == 1 and counts["aten.cos.out"] == 1
    assert counts["aten.copy_.default"] == 1


def test_a_cat_with_nothing_to_save_stays(traced) -> None:
    graph = traced(only_views, torch.randn(5))
    before = graph.op_counts()
    remove_cat_ops(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before


def test_a_part_the_cat_promotes_is_copied_with_its_conversion(traced) -> None:
    graph = traced(promoted, torch.randn(3), torch.arange(3))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.sin.out"] == 1 and counts["aten.abs.default"] == 1
    assert counts["aten.copy_.default"] == 1


def test_an_empty_part_the_cat_skips_is_left_out(traced) -> None:
    graph = traced(appended_to_empty, torch.randn(1, 2, 3, 4))
    remove_cat_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0 and counts["aten.neg.out"] == 1
    assert counts["aten.copy_.default"] == 0


@torch.no_grad()
def test_results_match_eager_and_the_option_turns_it_off() -> None:
    cases = [
        (rotate_half, lambda: (torch.randn(2, 4, 1, 8),)),
        (two_products, lambda: (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 5))),
        (shared_producer, lambda: (torch.randn(4),)),
        (promoted, lambda: (torch.randn(3), torch.arange(3))),
        (appended_to_empty, lambda: (torch.randn(1, 2, 3, 4),)),
    ]
    for fn, make in cases:
        kernels = {}
        for enabled in (True, False):
            torch._dynamo.reset()
            npugraph_ex.reset_stats()  # the other graph may outlive the reset until collected
            compiled = torch.compile(
                fn, backend="npugraph_ex", fullgraph=True, options={"remove_cat_ops": enabled}
            )
            for _ in range(2):
                args = make()
                assert_trees_equal(compiled(*args), fn(*args))
            kernels[enabled] = kernels_per_replay()
        if fn is two_products:
            assert kernels[True] == kernels[False] - 1  # the cat's copy is gone


# Symbolic sizes (torch.compile(dynamic=True)): one graph for every size.


def three_exps(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x.exp(), x.exp(), x.exp()], dim=0)


def along_a_dynamic_dim(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.cat([x.neg(), y.abs(), x[1:]], dim=0)  # s0, s1 and s0 - 1 rows


def along_a_static_dim(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x.neg(), x.abs() * 2], dim=1)  # [s0, 4] parts: the offsets are static


def rows(count: int) -> torch.Tensor:
    """``count`` rows of 4, the rows dynamic and the 4 static (under ``dynamic=True``)."""
    x = torch.randn(count, 4)
    torch._dynamo.mark_static(x, 1)
    return x


def half_width_more(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:, : x.shape[1] // 2] * 2, x.neg()], dim=1)  # the graph computes s1 // 2


def selected_first(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[x > 0].neg(), y.abs()])  # u0 rows, known before either part is made


def selected_last(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.cat([y.abs(), x[x > 0].neg()])  # u0 is known only after y.abs() is made


def only_views_of(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:2], x[2:]]) + 1


def is_size(value: object) -> bool:
    return isinstance(value, torch.SymInt)


def shape_guards(graph) -> int:
    """Guards the graph's shape environment holds (a pass must add none)."""
    return len(torch._guards.detect_fake_mode(graph.inputs).shape_env.guards)


def test_symbolic_offsets_are_int_arithmetic_on_the_size_inputs(traced) -> None:
    graph = traced(along_a_dynamic_dim, torch.randn(6, 4), torch.randn(3, 4), dynamic=True)
    rows_x, _, rows_y = (v for v in map(fake_value, graph.gm.graph.nodes) if is_size(v))
    guards = shape_guards(graph)
    remove_cat_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0 and counts["aten.copy_.default"] == 1
    assert counts["aten.neg.out"] == 1 and counts["aten.abs.out"] == 1
    (buffer,) = graph.gm.graph.find_nodes(op="call_function", target=aten.empty_strided.default)
    parts = [user for user in buffer.users if user.target is aten.slice.Tensor]
    bounds = [[fake_value(bound) for bound in part.args[2:]] for part in parts]
    expected = [
        [0, rows_x],
        [rows_x, rows_x + rows_y],
        [rows_x + rows_y, 2 * rows_x + rows_y - 1],  # x[1:] has s0 - 1 rows
    ]
    assert [[str(b) for b in part] for part in bounds] == [
        [str(b) for b in part] for part in expected
    ]
    assert shape_guards(graph) == guards  # nothing was specialised


def test_a_cat_along_a_static_dim_needs_no_size_arithmetic(traced) -> None:
    graph = traced(along_a_static_dim, rows(6), dynamic=True)
    before = graph.op_counts()
    guards = shape_guards(graph)
    remove_cat_ops(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0 and counts["aten.copy_.default"] == 0
    assert counts["aten.neg.out"] == 1 and counts["aten.mul.out"] == 1
    slices = graph.gm.graph.find_nodes(op="call_function", target=aten.slice.Tensor)
    assert [n.args[1:] for n in slices] == [(1, 0, 4), (1, 4, 8)]
    assert graph.count(operator.add) == before["<built-in function add>"] == 0
    assert shape_guards(graph) == guards


def test_a_size_the_graph_computes_is_read_where_it_is(traced) -> None:
    graph = traced(half_width_more, torch.randn(3, 6), dynamic=True)
    assert graph.count(operator.floordiv) == 1
    remove_cat_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    assert graph.op_counts()["aten.cat.default"] == 0
    assert graph.count(operator.floordiv) == 1  # s1 // 2 is reused, not rebuilt
    assert graph.count(operator.add) == 1  # the result's width, s1 + s1 // 2


def test_a_data_dependent_size_known_before_the_first_part_is_used(traced) -> None:
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        graph = traced(selected_first, torch.randn(8), torch.randn(3), dynamic=True)
    remove_cat_ops(graph.gm, graph.inputs, Config())
    graph.gm.graph.lint()
    counts = graph.op_counts()
    assert counts["aten.cat.default"] == 0
    assert counts["aten.neg.out"] == 1 and counts["aten.abs.out"] == 1


@pytest.mark.parametrize(
    ("fn", "args", "reason"),
    [
        pytest.param(
            selected_last,
            (torch.randn(8), torch.randn(3)),
            "its size s%d + u0 uses u0, which no graph input or node before its first written "
            "part holds",
            id="data-dependent-size-known-too-late",
        ),
        pytest.param(
            only_views_of,
            (torch.randn(7),),
            "no input is made only for it (nothing to save)",
            id="nothing-to-save",
        ),
    ],
)
def test_a_kept_cat_says_why_once_with_its_source_line(traced, caplog, fn, args, reason) -> None:
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        graph = traced(fn, *args, dynamic=True)
    before = graph.op_counts()
    with caplog.at_level("DEBUG", logger="npugraph_ex.passes.remove_cat"):
        remove_cat_ops(graph.gm, graph.inputs, Config())
    assert graph.op_counts() == before
    (message,) = [
        r.getMessage() for r in caplog.records if "remove_cat_ops: kept" in r.getMessage()
    ]
    assert "test_remove_cat.py" in message and "torch.cat" in message
    prefix, _, suffix = reason.partition("s%d")
    assert prefix in message and suffix in message


def test_arithmetic_the_pass_cannot_rebuild_is_named(traced) -> None:
    graph = traced(along_a_dynamic_dim, torch.randn(6, 4), torch.randn(3, 4), dynamic=True)
    sizes = SizeNodes(graph.gm.graph)
    values = [fake_value(n) for n in graph.gm.graph.find_nodes(op="placeholder")]
    s0, s1, *_ = (value.node.expr for value in values if isinstance(value, torch.SymInt))
    distance = sympy.Abs(s0 - s1)
    reason = sizes.missing_expr(distance, graph.gm.graph.output_node())
    assert reason == "uses Abs, which the pass does not rebuild"


SYMBOLIC_CASES = [
    pytest.param(three_exps, lambda n: (torch.randn(n),), 1, id="three-exps"),
    pytest.param(
        along_a_dynamic_dim,
        lambda n: (torch.randn(n, 4), torch.randn(n + 3, 4)),
        0,
        id="along-a-dynamic-dim",
    ),
    pytest.param(along_a_static_dim, lambda n: (rows(n),), 1, id="along-a-static-dim"),
    pytest.param(half_width_more, lambda n: (torch.randn(3, n),), 1, id="half-width-more"),
]


@torch.no_grad()
@pytest.mark.parametrize(("fn", "make", "saved"), SYMBOLIC_CASES)
def test_one_compile_serves_every_size_as_eager_does(fn, make, saved) -> None:
    kernels = {}
    for enabled in (True, False):
        torch._dynamo.reset()
        npugraph_ex.reset_stats()
        graphs = counters["stats"]["unique_graphs"]
        compiled = torch.compile(
            fn,
            backend="npugraph_ex",
            fullgraph=True,
            dynamic=True,
            options={"remove_cat_ops": enabled},
        )
        for n in (5, 8, 11, 5):
            args = make(n)
            assert_trees_equal(compiled(*args), fn(*args))
        assert counters["stats"]["unique_graphs"] == graphs + 1  # no recompile for a new size
        (graph,) = graphs_called()
        assert graph["captures"] == 3 and graph["replays"] == 1 and not graph["eager_calls"]
        kernels[enabled] = {key["kernels"] for key in graph["keys"].values()}
    (with_pass,), (without,) = kernels[True], kernels[False]
    assert with_pass == without - saved  # the cat's copy is gone where every part writes itself


@torch.no_grad()
def test_a_data_dependent_size_is_written_at_its_offsets() -> None:
    compiled = torch.compile(selected_first, backend="npugraph_ex", fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        for n in (6, 9):
            args = (torch.randn(n), torch.randn(n - 2))
            assert_trees_equal(compiled(*args), selected_first(*args))


def test_rebuilt_sizes_compute_what_their_expressions_say(traced) -> None:
    graph = traced(along_a_dynamic_dim, torch.randn(6, 4), torch.randn(3, 4), dynamic=True)
    values = [fake_value(n) for n in graph.gm.graph.find_nodes(op="placeholder")]
    a, _, b = (value for value in values if isinstance(value, torch.SymInt))
    expressions = {
        "a // b": (a // b, lambda a, b: a // b),
        "b // a": (b // a, lambda a, b: b // a),
        "12 // b": (12 // b, lambda a, b: 12 // b),
        "a % b": (a % b, lambda a, b: a % b),
        "max(a - b, 1)": (torch.sym_max(a - b, 1), lambda a, b: max(a - b, 1)),
        "min(a, b) + a * a * b - 1": (
            torch.sym_min(a, b) + a * a * b - 1,
            lambda a, b: min(a, b) + a * a * b - 1,
        ),
        "2 ** b - a": (2**b - a, lambda a, b: 2**b - a),
    }
    output = graph.gm.graph.output_node()
    size = SizeNodes(graph.gm.graph).builder(output)
    with graph.gm.graph.inserting_before(output):
        nodes = {name: size(value) for name, (value, _) in expressions.items()}
    graph.gm.graph.lint()
    graph.gm.recompile()
    for rows_a, rows_b in [(6, 3), (7, 4), (2, 9)]:
        run = torch.fx.Interpreter(graph.gm, garbage_collect_values=False)
        run.run(rows_a, 4, torch.randn(rows_a, 4), rows_b, torch.randn(rows_b, 4))
        for name, (_, compute) in expressions.items():
            assert run.env[nodes[name]] == compute(rows_a, rows_b), name
