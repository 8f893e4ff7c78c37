"""The CPU replay engine: what it re-issues, where it writes, and that it allocates nothing."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from helpers import capture_on_cpu as capture
from npugraph_ex.errors import CaptureError
from npugraph_ex.runtime import runtime_for
from npugraph_ex.runtime.base import Program
from npugraph_ex.runtime.cpu.steps import result_tensor_lister
from npugraph_ex.runtime.tensors import tensors_in
from npugraph_ex.schemas import out_variant

aten = torch.ops.aten


@pytest.mark.parametrize(
    ("op", "numbers", "expected"),
    [
        (aten.add.Tensor, frozenset(), aten.add.out),
        (aten.mul.Tensor, frozenset({"other"}), aten.mul.Scalar_out),
        (aten.pow.Tensor_Scalar, frozenset(), aten.pow.Tensor_Scalar_out),
        (aten.sum.dim_IntList, frozenset(), aten.sum.IntList_out),
        (aten.mm.default, frozenset(), aten.mm.out),
        (aten.full.default, frozenset(), aten.full.out),
        (aten.native_layer_norm.default, frozenset(), aten.native_layer_norm.out),
        (aten._scaled_dot_product_flash_attention_for_cpu.default, frozenset(), None),
    ],
)
def test_out_variant_is_found_by_schema(op, numbers, expected) -> None:
    found = out_variant(op, numbers)
    assert (found[0] if found else None) == expected


def linear_relu_views(x: torch.Tensor, w: torch.Tensor):
    h = (x @ w).relu()
    return h.view(-1) * 2 + 1, h.t(), h[1:]


def test_views_are_not_replayed_and_outputs_keep_their_addresses() -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    graph = capture(linear_relu_views, x, w)
    assert graph.kernel_count == 4  # mm, relu, mul, add; view, t and slice alias fixed memory
    assert graph.step_kinds == {"out": 4}
    assert graph.step_names == ["aten.mm.out", "aten.relu.out", "aten.mul.out", "aten.add.out"]
    addresses = [o.data_ptr() for o in graph.outputs]
    x.copy_(torch.randn(4, 8))  # a new value in the captured input's memory
    graph.replay()
    assert [o.data_ptr() for o in graph.outputs] == addresses
    for got, expected in zip(graph.outputs, linear_relu_views(x, w), strict=True):
        assert torch.equal(got, expected)


def test_replay_allocates_nothing_when_every_kernel_has_a_native_out_overload() -> None:
    def matmul_scale_sum(x, w):
        h = (x @ w) * 2 + 1
        return h.sum(0), h.t()

    graph = capture(matmul_scale_sum, torch.randn(4, 8), torch.randn(8, 8))
    graph.replay()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        graph.replay()
    names = [event.name for event in prof.events()]
    assert "[memory]" not in names
    assert not set(names) & {"aten::empty", "aten::empty_strided", "aten::empty_like"}
    assert {"aten::add", "aten::mm", "aten::mul", "aten::sum"} <= set(names)
    assert not set(names) & {"aten::_to_copy", "aten::clone", "aten::copy_"}


def test_kernel_without_out_overload_computes_and_copies() -> None:
    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) + 1

    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    graph = capture(attention, q, k, v)
    assert graph.step_kinds["copy"] == 1
    q.copy_(torch.randn(1, 2, 4, 8))
    graph.replay()
    assert torch.equal(graph.outputs[0], attention(q, k, v))


def test_compute_and_copy_steps_of_two_sizes_share_their_function() -> None:
    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) * 2

    short, long = ([torch.randn(1, 2, n, 8) for _ in range(3)] for n in (4, 9))
    first, second = capture(attention, *short), capture(attention, *long)
    (run_first,) = [fn for fn, _, _ in first.steps if fn.__qualname__.startswith("compute")]
    (run_second,) = [fn for fn, _, _ in second.steps if fn.__qualname__.startswith("compute")]
    assert run_first is run_second  # a key keeps no closure of its own
    for inputs, graph in ((short, first), (long, second)):
        inputs[0].copy_(torch.randn_like(inputs[0]))
        graph.replay()
        assert torch.equal(graph.outputs[0], attention(*inputs))


@pytest.mark.parametrize(
    "result",
    [
        torch.ones(2),
        (torch.ones(2), torch.zeros(3)),
        [torch.ones(2), torch.zeros(3)],
        (None, torch.ones(2), torch.zeros(3)),  # a tensor's place is after the None is dropped
        (torch.ones(2), [torch.zeros(3), torch.full((1,), 2.0)]),
    ],
    ids=["tensor", "tuple", "list", "with-none", "nested"],
)
def test_a_kernel_result_lists_its_tensors_as_capture_indexed_them(result) -> None:
    listed = result_tensor_lister(result)(result)
    expected = tensors_in(result)
    assert len(listed) == len(expected)
    assert all(a is b for a, b in zip(listed, expected, strict=True))


def test_in_place_kernels_are_reissued_on_the_same_tensor() -> None:
    def write(cache, index, value):
        cache.index_copy_(0, index, value)
        return cache.sum()

    cache, index, value = torch.zeros(4, 2), torch.tensor([1]), torch.ones(1, 2)
    graph = capture(write, cache, index, value)
    assert cache[1].tolist() == [1.0, 1.0]
    index.fill_(3)
    value.fill_(5.0)
    graph.replay()
    assert cache[3].tolist() == [5.0, 5.0]
    assert graph.outputs[0].item() == 12.0


def test_pool_bytes_count_the_memory_the_capture_owns() -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    graph = capture(linear_relu_views, x, w)
    # mm, relu, mul and add each make a 4x8 float32 buffer (128 bytes); views make none. relu's
    # and add's are outputs; mm's (dead after relu) and mul's (born after) share arena bytes.
    assert graph.pool_bytes == 3 * 4 * 8 * 4
    graph.release()
    assert graph.pool_bytes == 0
    assert graph.kernel_count == 0


def test_host_read_during_capture_is_refused() -> None:
    def reads_value(x):
        return x * aten._local_scalar_dense(x.sum())

    cpu = runtime_for("cpu")
    with pytest.raises(CaptureError, match="reads tensor data on the host"):
        cpu.capture(Program(reads_value), [torch.randn(3)], None)


def test_unknown_device_type_names_the_supported_ones() -> None:
    with pytest.raises(Exception, match="no graph runtime for device type 'xpu'; supported: cpu"):
        runtime_for("xpu")


def test_numbers_are_wrapped_once_at_capture_not_on_every_replay() -> None:
    graph = capture(lambda x: (x * 2 + 1).clone(), torch.randn(8))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        graph.replay()
    names = {event.name for event in prof.events()}
    assert not names & {"aten::empty", "aten::empty_strided", "aten::_to_copy", "aten::clone"}


def test_numbers_keep_their_promotion_where_wrapping_would_change_it() -> None:
    def scale(x):
        return x * 2.5

    x = torch.arange(4, dtype=torch.int32)
    graph = capture(scale, x)
    x.copy_(torch.tensor([3, 1, 4, 1], dtype=torch.int32))
    graph.replay()
    assert graph.outputs[0].dtype == torch.float32
    assert torch.equal(graph.outputs[0], scale(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_prims_dtype_conversion_replays_as_one_copy(dtype) -> None:
    convert = torch.ops.prims.convert_element_type.default

    def upcast_scale(x):
        return convert(x, dtype) * 3

    x = torch.randn(4, 6)[:, ::2]  # strided: the copy must keep the recorded layout
    graph = capture(upcast_scale, x)
    assert graph.step_kinds == {"out": 2}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        graph.replay()
    names = {event.name for event in prof.events()}
    assert "aten::copy_" in names
    if dtype != torch.bfloat16:  # bf16 keeps the 3 a number (wrapped per call, as in eager)
        assert not names & {"aten::empty", "aten::empty_like", "aten::empty_strided"}
    x.copy_(torch.randn(4, 3))
    assert torch.equal(graph.replay()[0], upcast_scale(x))
