"""The decompositions a key's graph gets before Inductor: few-row matrix products on CPU."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import npugraph_ex
from helpers import graphs_called
from npugraph_ex.kernels.decompositions import few_rows_times_matrix, few_rows_times_matrix_plus
from npugraph_ex.kernels.static_compile import specialise
from npugraph_ex.passes.patterns import onednn_linear
from npugraph_ex.runtime.cpu import probes as host_probes
from npugraph_ex.runtime.cpu.platform import REDUCTION_LARGE_WEIGHT_ELEMENTS as LARGE_WEIGHT
from npugraph_ex.runtime.cpu.platform import REDUCTION_MAX_ROWS as MAX_ROWS
from npugraph_ex.runtime.cpu.platform import REDUCTION_MAX_ROWS_LARGE_WEIGHT as MAX_ROWS_LARGE

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def reduction_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host where the reduction pays, whatever this one measures (one test says otherwise)."""
    monkeypatch.setattr(host_probes, "reduction_pays", lambda dtype=torch.float32: True)


def linear_graph(bias: bool) -> torch.fx.GraphModule:
    """An ATen graph of ``x @ w.t() (+ b)``, as AOTAutograd gives a linear layer."""

    def with_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
        return (aten.addmm.default(b, x, aten.permute.default(w, [1, 0])),)

    def without_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
        return (aten.mm.default(x, aten.permute.default(w, [1, 0])),)

    return torch.fx.symbolic_trace(with_bias if bias else without_bias)


def specialised_ops(gm: torch.fx.GraphModule, *args: torch.Tensor) -> Counter[str]:
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    fake_args = [fake_mode.from_tensor(a, static_shapes=True) for a in args]
    static = specialise(gm, fake_args, fake_mode)
    return Counter(
        str(n.target.overloadpacket) for n in static.graph.nodes if n.op == "call_function"
    )


@pytest.mark.parametrize("rows", [1, MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
def test_a_product_of_few_rows_becomes_a_reduction(bias: bool, rows: int) -> None:
    x, w, b = torch.randn(rows, 64), torch.randn(32, 64), torch.randn(32)
    ops = specialised_ops(linear_graph(bias), x, w, b)
    assert ops["aten.mm"] == ops["aten.addmm"] == 0
    assert ops["aten.mul"] == 1 and ops["aten.sum"] == 1


@pytest.mark.parametrize("bias", [False, True])
def test_a_product_of_more_rows_stays_a_matrix_product(bias: bool) -> None:
    x, w, b = torch.randn(MAX_ROWS + 1, 64), torch.randn(32, 64), torch.randn(32)
    ops = specialised_ops(linear_graph(bias), x, w, b)
    assert ops["aten.addmm" if bias else "aten.mm"] == 1
    assert ops["aten.sum"] == 0


@pytest.mark.parametrize("rows", [1, 5])
def test_the_reduction_computes_the_product(rows: int) -> None:
    x, w, b = torch.randn(rows, 256), torch.randn(512, 256), torch.randn(512)
    # Sums of 256 products in another order: fp32 rounding, relative to the sums' size.
    close = {"atol": 1e-4, "rtol": 1e-5}
    torch.testing.assert_close(few_rows_times_matrix(x, w.t()), x @ w.t(), **close)
    torch.testing.assert_close(
        few_rows_times_matrix_plus(b, x, w.t(), beta=0.5, alpha=2.0),
        torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0),
        **close,
    )


def test_integer_products_are_left_to_aten() -> None:
    x, w = torch.ones(1, 4, dtype=torch.int64), torch.ones(4, 3, dtype=torch.int64)
    assert few_rows_times_matrix(x, w) is NotImplemented


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_summed_in_float32_and_rounded_once(dtype: torch.dtype) -> None:
    x, w, b = (torch.randn(*shape).to(dtype) for shape in ((2, 256), (512, 256), (512,)))
    # ATen accumulates in float32 and rounds once: within one unit in the last place of the
    # float32 product rounded (the float32 sums' order, 1e-5 near zero, may round a tie the
    # other way), where a sum rounded at every step would be off by many over 256 terms.
    want = (x.float() @ w.float().t()).to(dtype)
    ulp = {"rtol": torch.finfo(dtype).eps, "atol": 1e-5}
    torch.testing.assert_close(few_rows_times_matrix(x, w.t()), want, **ulp)
    torch.testing.assert_close(
        few_rows_times_matrix_plus(b, x, w.t()), torch.addmm(b, x, w.t()), atol=2e-2, rtol=1e-2
    )
    ops = specialised_ops(linear_graph(False), x, w, b)
    assert ops["aten.mm"] == 0 and ops["aten.sum"] == 1
    assert ops["prims.convert_element_type"] == 3  # x and w up, the sum down


def test_the_probe_answers_per_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_probes, "reduction_pays", lambda dtype: dtype == torch.float32)
    x, w, b = torch.randn(1, 64), torch.randn(32, 64), torch.randn(32)
    assert specialised_ops(linear_graph(False), x, w, b)["aten.sum"] == 1
    half = [t.to(torch.bfloat16) for t in (x, w, b)]
    assert specialised_ops(linear_graph(False), *half)["aten.mm"] == 1


def test_column_products_are_left_to_aten() -> None:
    assert few_rows_times_matrix(torch.randn(1, 4), torch.randn(4, 1)) is NotImplemented


def test_a_host_where_the_reduction_does_not_pay_keeps_the_matrix_product(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(host_probes, "reduction_pays", lambda dtype=torch.float32: False)
    x, w, b = torch.randn(1, 64), torch.randn(32, 64), torch.randn(32)
    ops = specialised_ops(linear_graph(False), x, w, b)
    assert ops["aten.mm"] == 1 and ops["aten.sum"] == 0


def test_the_reduction_probe_times_one_thread_and_leaves_the_thread_count() -> None:
    threads = torch.get_num_threads()
    result = host_probes.reduction_probe(threads)
    assert torch.get_num_threads() == threads
    assert result.threads == 1 and result.mm_ms > 0 and result.other_ms > 0
    assert result.pays == (result.gain >= host_probes.REDUCTION_GAIN)
    assert host_probes.reduction_probe(threads, torch.bfloat16).mm_ms > 0


ONEDNN_WEIGHT = (512, 128)
"""The smallest weight ``onednn_linear`` takes (``MIN_WEIGHT_ELEMENTS``)."""


@pytest.mark.parametrize("bias", [False, True])
def test_a_product_by_a_large_weight_goes_through_onednn(monkeypatch, bias: bool) -> None:  # noqa: ANN001
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: True)
    x, w, b = torch.randn(MAX_ROWS + 1, 128), torch.randn(*ONEDNN_WEIGHT), torch.randn(512)
    ops = specialised_ops(linear_graph(bias), x, w, b)
    assert ops["mkldnn._linear_pointwise"] == 1
    assert ops["aten.mm"] == ops["aten.addmm"] == 0
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: False)
    ops = specialised_ops(linear_graph(bias), x, w, b)
    assert ops["mkldnn._linear_pointwise"] == 0
    assert ops["aten.addmm" if bias else "aten.mm"] == 1


def test_few_rows_stay_a_reduction_where_onednn_would_take_them(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: True)
    x, w, b = torch.randn(MAX_ROWS, 128), torch.randn(*ONEDNN_WEIGHT), torch.randn(512)
    ops = specialised_ops(linear_graph(False), x, w, b)
    assert ops["aten.sum"] == 1 and ops["mkldnn._linear_pointwise"] == 0


def test_a_weight_the_caches_cannot_keep_becomes_a_reduction_at_fewer_rows(monkeypatch) -> None:  # noqa: ANN001
    # The reduction reads the weight once per row, oneDNN's linear once: from memory, the
    # reduction loses from 4 rows on (runtime/cpu/platform.py, REDUCTION_LARGE_WEIGHT_ELEMENTS).
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: True)
    large, under = torch.empty(LARGE_WEIGHT // 256, 256), torch.empty(LARGE_WEIGHT // 256 - 1, 256)
    for rows, w, reduced in (
        (MAX_ROWS_LARGE, large, True),
        (MAX_ROWS_LARGE + 1, large, False),
        (MAX_ROWS, large, False),
        (MAX_ROWS, under, True),
    ):
        ops = specialised_ops(linear_graph(False), torch.randn(rows, 256), w, torch.empty(1))
        product = ops["mkldnn._linear_pointwise"] + ops["aten.mm"]  # oneDNN from 4 rows on
        assert (ops["aten.sum"], product) == ((1, 0) if reduced else (0, 1)), (rows, w.shape)


@torch.no_grad()
def test_static_kernels_call_onednn_and_leave_inductors_lowering_as_it_was(monkeypatch) -> None:  # noqa: ANN001
    from torch._inductor import lowering

    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: True)
    torch._dynamo.reset()
    lowered_before = lowering.lowerings.get(onednn_linear.LINEAR)
    layer = torch.nn.Linear(128, ONEDNN_WEIGHT[0])
    compiled = torch.compile(layer, backend="npugraph_ex", options={"static_kernel_compile": True})
    x = torch.randn(20, 128)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)
    (graph,) = npugraph_ex.stats()["graphs"][-1:]
    # Compiled here, or found in Inductor's cache where an earlier test compiled the same graph.
    assert graph["static_kernels"] in ({"compiled": 1}, {"cache_hit": 1})
    assert lowering.lowerings.get(onednn_linear.LINEAR) is lowered_before


def test_a_compile_process_chooses_by_the_serving_process_s_measurements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A compile process is a fresh interpreter: what it measured itself (one core, the serving
    # process's threads on it) took seconds of each compile and could choose otherwise. Here
    # the serving process measured oneDNN slower at every count (this host measures it faster).
    from npugraph_ex.kernels.graph_bytes import pickle_graph
    from npugraph_ex.kernels.remote_compile import compile_in_worker, input_specs

    monkeypatch.setattr(host_probes, "MEASURED", {})  # as in a new process
    threads = torch.get_num_threads()
    slower = host_probes.Probe(threads, 0.5, 1.0, host_probes.LINEAR_GAIN)
    answers = {("linear_probe", threads): dict.fromkeys(host_probes.LINEAR_PROBE_ROWS, slower)}
    x, w, b = torch.randn(MAX_ROWS + 1, 128), torch.randn(*ONEDNN_WEIGHT), torch.randn(512)
    specs = input_specs([x, w, b])
    compiled, _, _ = compile_in_worker(
        pickle_graph(linear_graph(True)), specs, "cpu", True, None, threads, answers
    )
    assert b"addmm" in compiled and b"_linear_pointwise" not in compiled
    assert host_probes.MEASURED == answers  # nothing measured in the compile process


def attention_scores_over_a_cache(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """A cache's first step, as Hugging Face's eager attention takes it: the keys appended to
    an empty cache (``torch.tensor([])``), then the scores against them transposed."""
    keys = torch.cat([torch.tensor([]), key], dim=-2)
    return torch.matmul(query, keys.transpose(-1, -2))


@torch.no_grad()
def test_a_cat_that_keeps_one_input_is_laid_out_as_atens_for_the_views_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The key arrives transposed (per head, from a projection); at a batch of two the product
    # views the cat's result (as contiguous, as ATen's cat makes it), which Inductor's cat kept
    # transposed: the re-trace failed and the key captured ATen.
    torch._dynamo.reset()
    fn = torch.compile(
        attention_scores_over_a_cache,
        backend="npugraph_ex",
        options={"static_kernel_compile": True},
    )
    query = torch.randn(2, 4, 8, 16)
    key = torch.randn(2, 8, 4, 16).transpose(1, 2)
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        for _ in range(2):
            torch.testing.assert_close(
                fn(query, key), attention_scores_over_a_cache(query, key), rtol=1e-5, atol=1e-5
            )
    assert [r.getMessage() for r in caplog.records] == []
    (graph,) = npugraph_ex.stats()["graphs"][-1:]
    assert graph["static_kernels"] in ({"compiled": 1}, {"cache_hit": 1})


@torch.no_grad()
def test_an_activation_read_by_a_reduction_is_computed_once() -> None:
    # The reduction reads each element of its input once per output column; the GELU that
    # makes that input must run in a loop of its own, not inside the reduction's (where it
    # would compute erf 64 times for each element here, 256 times for a layer of 256).
    from torch._inductor.utils import run_and_get_cpp_code

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)
    ).eval()
    options = {"static_kernel_compile": True, "disable_static_kernel_compile_cache": True}
    fn = torch.compile(model, backend="npugraph_ex", options=options)
    x = torch.randn(1, 64)
    out, code = run_and_get_cpp_code(fn, x)
    loops = code.split("#pragma omp")
    assert [loop for loop in loops if "erf" in loop], "no GELU in the generated code"
    assert not [loop for loop in loops if "tmp_acc" in loop and "erf" in loop]
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert [graph["static_kernels"] for graph in graphs_called()] == [{"compiled": 1}]
