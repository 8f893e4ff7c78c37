"""A replacement whose output comes out in another layout: the views past it that no longer fit
read a contiguous copy, and the graph's outputs keep eager's layout."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import npugraph_ex
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.patterns import add_replacement, registry

aten = torch.ops.aten


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b)


def transposed_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same values, laid out column by column."""
    return torch.mm(b.t(), a.t()).t()


@pytest.fixture(autouse=True)
def transposing(scratch_registry: None) -> None:
    npugraph_ex.register_replacement(
        product, transposed_product, [torch.randn(3, 4), torch.randn(4, 5)]
    )


def flattened(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b).view(-1) * 2


def split_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b).view(2, 3, 8) * 2


def expanded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b).unsqueeze(0).expand(2, -1, -1)


def sliced(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b)[:, 1:]


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(6, 4), torch.randn(4, 8)


def test_a_view_the_new_layout_cannot_serve_reads_a_contiguous_copy(traced) -> None:  # noqa: ANN001
    a, b = inputs()
    graph = traced(flattened, a, b)
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert graph.count(aten.clone.default) == 1
    (copy,) = [node for node in graph.gm.graph.nodes if node.target is aten.clone.default]
    assert copy.kwargs == {"memory_format": torch.contiguous_format}
    assert [user.target for user in copy.users] == [aten.view.default]
    torch.testing.assert_close(graph.run(a, b)[0], flattened(a, b))


def test_a_view_that_still_fits_reads_the_output_in_place(traced) -> None:  # noqa: ANN001
    a, b = inputs()
    graph = traced(split_rows, a, b)
    fuse_patterns(graph.gm, graph.inputs, Config())
    (view,) = [node for node in graph.gm.graph.nodes if node.target is aten.view.default]
    assert view.args[0].target is aten.t.default  # the replacement's output, read in place
    # The product of the output with 2 is laid out as the view, column by column: the graph's
    # output is copied back into eager's layout, and only it.
    (output,) = graph.gm.graph.output_node().args[0]
    assert output.target is aten.clone.default and output.args[0].target is aten.mul.Tensor
    assert graph.count(aten.clone.default) == 1
    out = graph.run(a, b)[0]
    torch.testing.assert_close(out, split_rows(a, b))
    assert out.is_contiguous()


def test_a_value_no_pass_recorded_is_worked_out_and_not_compared(traced) -> None:  # noqa: ANN001
    # An earlier pass may leave a node without a recorded value: past a replacement it gets
    # one, and nothing is compared with what is not there.
    a, b = inputs()
    graph = traced(split_rows, a, b)
    (product,) = [n for n in graph.gm.graph.nodes if n.target is aten.mul.Tensor]
    del product.meta["val"]
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert product.meta["val"].shape == (2, 3, 8)
    torch.testing.assert_close(graph.run(a, b)[0], split_rows(a, b))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize(
    "fn",
    [flattened, product, expanded, sliced],
    ids=["viewed", "returned", "returned expanded", "returned sliced"],
)
@torch.no_grad()
def test_replays_give_eager_values_in_eager_layout(fn, dynamic) -> None:  # noqa: ANN001
    compiled = torch.compile(
        fn, backend="npugraph_ex", dynamic=dynamic, options={"static_kernel_compile": False}
    )
    for rows in (6, 6, 9):
        a, b = torch.randn(rows, 4), torch.randn(4, 8)
        out, expected = compiled(a, b), fn(a, b)
        torch.testing.assert_close(out, expected)
        assert out.stride() == expected.stride()


def test_an_output_view_is_taken_again_of_its_input_in_the_layout_it_was_traced_on(
    traced,  # noqa: ANN001
) -> None:
    # Eager's output is a view of a contiguous product (strides (0, 8, 1)); a copy of the view
    # cannot give that layout, so the view is taken again of its input taken again of a
    # contiguous copy of the product.
    a, b = inputs()
    graph = traced(expanded, a, b)
    fuse_patterns(graph.gm, graph.inputs, Config())
    (output,) = graph.gm.graph.output_node().args[0]
    assert output.target is aten.expand.default
    assert output.args[0].target is aten.unsqueeze.default
    assert output.args[0].args[0].target is aten.clone.default
    out = graph.run(a, b)[0]
    torch.testing.assert_close(out, expanded(a, b))
    assert out.stride() == (0, 8, 1)


def strided_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Reads the product's memory as it was laid out when traced: row by row.
    return torch.mm(a, b).as_strided((3, 8), (16, 1)) * 2


def strided_from_a_slice(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # The slice starts 8 elements into the product's memory, which as_strided reads from.
    return torch.mm(a, b)[1:].as_strided((3, 8), (16, 1), 8) * 2


@pytest.mark.parametrize(
    ("fn", "read"),
    [
        (strided_rows, [aten.clone.default]),
        (strided_from_a_slice, [aten.slice.Tensor, aten.clone.default]),
    ],
    ids=["of the product", "of a slice, at its offset"],
)
def test_as_strided_reads_its_input_in_the_layout_it_was_traced_on(traced, fn, read) -> None:  # noqa: ANN001
    # A contiguous copy of the product; of a slice, the slice taken again of that copy.
    a, b = inputs()
    graph = traced(fn, a, b)
    fuse_patterns(graph.gm, graph.inputs, Config())
    (node,) = [n for n in graph.gm.graph.nodes if n.target is aten.as_strided.default]
    for target in read:
        node = node.args[0]
        assert node.target is target
    torch.testing.assert_close(graph.run(a, b)[0], fn(a, b))


def product_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y


def product_in_the_first_dtype(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The search function's result where both inputs have one dtype (the examples'), not
    otherwise."""
    return (x * y).to(x.dtype)


def relu_of_product(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return product_of(x, y).relu()


def failed_passes_of_mixed_dtypes(fn: Any) -> int:
    """Compile ``fn`` and call it on a float16 and a float32 input: the result must be eager's
    float32; how many passes failed."""
    npugraph_ex.reset_stats()
    x, y = torch.randn(5, dtype=torch.float16), torch.randn(5)
    compiled = torch.compile(fn, backend="npugraph_ex", options={"static_kernel_compile": False})
    with torch.no_grad():
        out = compiled(x, y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, fn(x, y))
    return npugraph_ex.stats()["totals"]["failed_passes"]


@pytest.mark.parametrize("fn", [relu_of_product, product_of], ids=["read", "returned"])
def test_a_user_replacement_computing_another_dtype_for_a_match_is_refused_there(
    fn, caplog
) -> None:  # noqa: ANN001
    npugraph_ex.register_replacement(
        product_of, product_in_the_first_dtype, [torch.randn(4), torch.randn(4)]
    )
    assert failed_passes_of_mixed_dtypes(fn) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "is left as it is" in r.getMessage()]
    assert warning.startswith(
        "npugraph_ex: a match of search function product_of() is left as it is: replacement "
        "function product_in_the_first_dtype() returns float16 [5] on cpu where product_of() "
        "returns float32 [5] on cpu (at "
    )


@pytest.mark.parametrize("fn", [relu_of_product, product_of], ids=["read", "returned"])
def test_a_replacement_computing_another_dtype_past_every_check_drops_the_pass(fn, caplog) -> None:  # noqa: ANN001
    # A pattern added without the results check (as the built-in ones are): the graph's own
    # values past the replacement catch it.
    add_replacement(
        registry(), product_of, product_in_the_first_dtype, [torch.randn(4), torch.randn(4)]
    )
    assert failed_passes_of_mixed_dtypes(fn) == 1
    (warning,) = [r.getMessage() for r in caplog.records if "pattern_fusion_pass" in r.getMessage()]
    assert "ReplacementError: a replacement changed what" in warning
    assert "float16 [5] on cpu where the graph was traced with float32 [5] on cpu" in warning


def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def doubled_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The same values, laid out contiguous whatever the input's layout."""
    return x.contiguous() * 2


@torch.no_grad()
def test_a_channels_last_output_is_copied_back_into_channels_last(traced) -> None:  # noqa: ANN001
    npugraph_ex.register_replacement(doubled, doubled_contiguous, [torch.randn(2, 3, 4, 5)])
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    graph = traced(doubled, x)
    fuse_patterns(graph.gm, graph.inputs, Config())
    (output,) = graph.gm.graph.output_node().args[0]
    assert output.target is aten.clone.default
    assert output.kwargs == {"memory_format": torch.channels_last}
    out = graph.run(x)[0]
    torch.testing.assert_close(out, doubled(x))
    assert out.stride() == doubled(x).stride()


def shifted_back(x: torch.Tensor) -> torch.Tensor:
    return (x + 0.5) - 0.5


def itself(x: torch.Tensor) -> torch.Tensor:
    return x


@pytest.mark.parametrize("kernels", [False, True], ids=["aten", "kernels"])
@torch.no_grad()
def test_an_output_a_replacement_made_the_input_is_a_new_tensor(kernels: bool) -> None:
    # Eager's output is a new tensor; the replacement made it the caller's input itself, which
    # the kernels returned as it is: writing to the output wrote to the input.
    npugraph_ex.register_replacement(shifted_back, itself, [torch.randn(4)])
    compiled = torch.compile(
        lambda x: (shifted_back(x), shifted_back(x).t()),
        backend="npugraph_ex",
        options={"static_kernel_compile": kernels},
    )
    for _ in range(3):  # the first call runs the captured graph, the next ones the replay
        x = torch.randn(3, 4)
        kept = x.clone()
        out, transposed = compiled(x)
        assert out.data_ptr() != x.data_ptr() and transposed.data_ptr() != x.data_ptr()
        out.add_(1)
        transposed.add_(1)
        assert torch.equal(x, kept)
        assert transposed.stride() == (1, 4)
