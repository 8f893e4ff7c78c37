"""The built-in oneDNN product pattern: ``mm``/``addmm`` by a weight of at least
``MIN_WEIGHT_ELEMENTS``, with at least ``MIN_ROWS`` rows or a symbolic row count, becomes
oneDNN's linear kernel where the host probe says it pays."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from helpers import aten_graph, intra_op_threads
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.patterns import onednn_linear
from npugraph_ex.runtime.cpu import platform as cpu_platform
from npugraph_ex.runtime.cpu import probes as host_probes
from npugraph_ex.runtime.cpu.platform import LINEAR_MIN_ROWS as MIN_ROWS
from npugraph_ex.runtime.cpu.platform import LINEAR_MIN_WEIGHT_ELEMENTS as MIN_WEIGHT_ELEMENTS

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)

MM, ADDMM = "aten.mm.default", "aten.addmm.default"
LINEAR = "mkldnn._linear_pointwise.default"
WEIGHT = (512, 128)
"""A weight of ``MIN_WEIGHT_ELEMENTS``: the smallest the pattern takes."""
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
"""Another kernel sums each dot product, perhaps in another order (sums of 128 products of
unit-scale values, about 11 in size)."""


@pytest.fixture
def pays(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A host where oneDNN pays and the few-row split does not (whatever this one says), on
    two threads."""
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: True)
    monkeypatch.setattr(host_probes, "split_pays", lambda: False)
    torch._dynamo.reset()
    with intra_op_threads(2):
        yield


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def counts_after(traced, fn, *args, **options) -> dict[str, int]:  # noqa: ANN001
    graph = traced(fn, *args)
    fuse_patterns(graph.gm, graph.inputs, Config(**options))
    graph.gm.graph.lint()
    counts = graph.op_counts()
    return {op: counts[op] for op in (MM, ADDMM, LINEAR)}


@pytest.mark.parametrize("rows", [MIN_ROWS, 20, 300])
def test_a_product_by_a_large_weight_becomes_onednns_linear(traced, pays, rows) -> None:
    x, w = torch.randn(rows, 128), torch.randn(*WEIGHT)
    assert w.numel() == MIN_WEIGHT_ELEMENTS
    assert counts_after(traced, product, x, w) == {MM: 0, ADDMM: 0, LINEAR: 1}


def test_a_linear_with_a_bias_becomes_one_onednn_linear(traced, pays) -> None:
    args = torch.randn(20, 128), torch.randn(*WEIGHT), torch.randn(WEIGHT[0])
    counts = counts_after(traced, torch.nn.functional.linear, *args)
    assert counts == {MM: 0, ADDMM: 0, LINEAR: 1}


@pytest.mark.parametrize(
    ("rows", "weight", "dtype"),
    [
        (MIN_ROWS - 1, WEIGHT, torch.float32),
        (20, (WEIGHT[0] - 1, WEIGHT[1]), torch.float32),
        (20, WEIGHT, torch.float64),
        (20, WEIGHT, torch.bfloat16),
    ],
    ids=["too few rows", "a weight too small", "float64", "bfloat16"],
)
def test_what_it_leaves_to_mm(traced, pays, rows, weight, dtype) -> None:
    x, w = torch.randn(rows, 128, dtype=dtype), torch.randn(*weight, dtype=dtype)
    assert counts_after(traced, product, x, w) == {MM: 1, ADDMM: 0, LINEAR: 0}


def test_a_non_contiguous_weight_or_a_bias_to_broadcast_is_left_alone(traced, pays) -> None:
    x, wide = torch.randn(20, 128), torch.randn(WEIGHT[0], 2 * WEIGHT[1])
    assert counts_after(traced, product, x, wide[:, ::2]) == {MM: 1, ADDMM: 0, LINEAR: 0}

    def plus_row(x, w, b):  # noqa: ANN001, ANN202
        return torch.addmm(b, x, w.t())

    counts = counts_after(traced, plus_row, x, torch.randn(*WEIGHT), torch.randn(1, WEIGHT[0]))
    assert counts == {MM: 0, ADDMM: 1, LINEAR: 0}


def test_static_kernels_or_a_host_where_it_does_not_pay_keep_mm(traced, pays, monkeypatch) -> None:  # noqa: ANN001
    x, w = torch.randn(20, 128), torch.randn(*WEIGHT)
    kept = {MM: 1, ADDMM: 0, LINEAR: 0}
    assert counts_after(traced, product, x, w, static_kernel_compile=True) == kept
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: False)
    assert counts_after(traced, product, x, w) == kept


def test_a_torch_build_without_onednn_keeps_mm(traced, pays, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(onednn_linear, "LINEAR", None)  # what compat.onednn_linear_op gives there
    x, w = torch.randn(20, 128), torch.randn(*WEIGHT)
    assert counts_after(traced, product, x, w) == {MM: 1, ADDMM: 0, LINEAR: 0}


def test_few_rows_the_split_takes_are_split_not_linear(traced, pays, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(host_probes, "split_pays", lambda: True)
    x, w = torch.randn(MIN_ROWS, 128), torch.randn(*WEIGHT)
    counts = counts_after(traced, product, x, w)
    assert counts == {MM: 0, ADDMM: 0, LINEAR: 0}


@torch.no_grad()
def test_replays_match_eager_and_read_a_weight_changed_in_place(pays) -> None:
    linear = torch.nn.Linear(128, WEIGHT[0])
    compiled = torch.compile(linear, backend="npugraph_ex", fullgraph=True)
    x = torch.randn(20, 128)
    for _ in range(2):  # a capture, then a replay
        torch.testing.assert_close(compiled(x), linear(x), **TOLERANCE)
    linear.weight.mul_(-2.0)
    linear.bias.add_(1.0)
    got = compiled(x)
    torch.testing.assert_close(got, linear(x), **TOLERANCE)
    assert got.is_contiguous()


def ops_by_rows(before: set[int]) -> dict[int, set[str]]:
    """The ops each captured key replays, by the row count of its (one) input."""
    return {
        int(entry.label.split("shapes=[")[1].split("x")[0]): set(aten_graph(entry).step_names)
        for manager in managers_since(before)
        for entry in manager.entries.values()
    }


@torch.no_grad()
def test_a_dynamic_graph_runs_each_key_as_a_graph_compiled_for_its_rows(pays, monkeypatch) -> None:  # noqa: ANN001
    """A symbolic row count is taken (oneDNN runs any rows); each key then runs what a graph
    compiled for its rows would: the split, ``mm`` below ``MIN_ROWS``, oneDNN's linear."""
    monkeypatch.setattr(host_probes, "split_pays", lambda: True)
    before = live_graph_numbers()
    linear = torch.nn.Linear(128, WEIGHT[0], bias=False)  # a parameter: its sizes stay fixed
    compiled = torch.compile(linear, backend="npugraph_ex", fullgraph=True, dynamic=True)
    for rows in (2, 6, 9, 20):
        x = torch.randn(rows, 128)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), linear(x), **TOLERANCE)
    monkeypatch.setattr(host_probes, "split_pays", lambda: False)
    x = torch.randn(3, 128)
    torch.testing.assert_close(compiled(x), linear(x), **TOLERANCE)
    ops = ops_by_rows(before)
    onednn = f"compute_and_copy[{LINEAR}]"
    assert "aten.bmm.out" in ops[2] and "aten.bmm.out" in ops[6]
    assert "aten.mm.out" in ops[3] and onednn not in ops[3]  # below MIN_ROWS, no split: mm
    assert onednn in ops[9] and onednn in ops[20]
    assert "aten.mm.out" not in ops[9] | ops[20]


@torch.no_grad()
def test_row_counts_where_onednn_does_not_pay_stay_mm(traced, pays, monkeypatch) -> None:  # noqa: ANN001
    """A host where oneDNN pays from 16 rows on only (as on MKL's Intel code paths): a graph
    of 9 rows keeps ``mm``; a dynamic graph's 9-row key runs ``mm``, its 20-row key oneDNN."""
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: rows is None or rows >= 16)
    w = torch.randn(*WEIGHT)
    assert counts_after(traced, product, torch.randn(9, 128), w) == {MM: 1, ADDMM: 0, LINEAR: 0}
    assert counts_after(traced, product, torch.randn(20, 128), w) == {MM: 0, ADDMM: 0, LINEAR: 1}
    before = live_graph_numbers()
    linear = torch.nn.Linear(128, WEIGHT[0], bias=False)
    compiled = torch.compile(linear, backend="npugraph_ex", fullgraph=True, dynamic=True)
    for rows in (9, 20):
        x = torch.randn(rows, 128)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), linear(x), **TOLERANCE)
    ops = ops_by_rows(before)
    onednn = f"compute_and_copy[{LINEAR}]"
    assert "aten.mm.out" in ops[9] and onednn not in ops[9]
    assert onednn in ops[20] and "aten.mm.out" not in ops[20]


def test_the_host_probe_times_both_per_row_count_and_uses_onednn_where_it_pays() -> None:
    results = host_probes.linear_probe(2)
    assert tuple(results) == host_probes.LINEAR_PROBE_ROWS
    for result in results.values():
        assert result.threads == 2 and result.mm_ms > 0 and result.other_ms > 0
        assert result.pays == (result.mm_ms / result.other_ms >= host_probes.LINEAR_GAIN)
    assert host_probes.linear_probe(2) is results  # measured once per process and thread count
    with intra_op_threads(2):
        assert host_probes.linear_pays(20) == results[16].pays  # 16 stands for 16 to 31
        assert host_probes.linear_pays(3) is False  # below the first count probed
        assert host_probes.linear_pays(None) == any(r.pays for r in results.values())
        assert "onednn_linear_16" in host_probes.decisions()


@torch.no_grad()
def test_past_the_row_counts_given_to_onednn_a_new_key_runs_mm(pays, monkeypatch) -> None:  # noqa: ANN001
    """oneDNN keeps generated code for every shape it runs, for the process's life: it is given
    ``MAX_ROW_COUNTS`` distinct row counts, and a key at a further count runs ``mm``."""
    monkeypatch.setattr(cpu_platform, "LINEAR_MAX_ROW_COUNTS", 2)
    before = live_graph_numbers()
    linear = torch.nn.Linear(128, WEIGHT[0], bias=False)
    compiled = torch.compile(linear, backend="npugraph_ex", fullgraph=True, dynamic=True)
    for rows in (9, 20, 30, 9):
        x = torch.randn(rows, 128)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), linear(x), **TOLERANCE)
    ops = ops_by_rows(before)
    onednn = f"compute_and_copy[{LINEAR}]"
    assert onednn in ops[9] and onednn in ops[20]
    assert "aten.mm.out" in ops[30] and onednn not in ops[30]
    assert cpu_platform.LINEAR_ROW_COUNTS == {9, 20}
    assert cpu_platform.linear_takes_rows(9) and not cpu_platform.linear_takes_rows(31)
