"""pattern_fusion_pass and the public register_replacement."""

from __future__ import annotations

import pytest
import torch

import npugraph_ex
from helpers import kernels_per_replay
from npugraph_ex.config import Config
from npugraph_ex.passes.fuse_patterns import fuse_patterns
from npugraph_ex.passes.manager import PassManager
from npugraph_ex.passes.patterns import registry
from npugraph_ex.passes.pipeline import PIPELINE
from npugraph_ex.scope import stream

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("scratch_registry")


def sinh_plus_cosh(x: torch.Tensor) -> torch.Tensor:
    return torch.sinh(x) + torch.cosh(x)


def exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


def model(x: torch.Tensor) -> torch.Tensor:
    return sinh_plus_cosh(x * 3).relu()


def test_a_registered_user_pattern_is_applied(traced) -> None:
    assert npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)])
    graph = traced(model, torch.randn(2, 3))
    fuse_patterns(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.exp.default"] == 1
    assert "aten.sinh.default" not in counts and "aten.cosh.default" not in counts


@torch.no_grad()
def test_a_registered_pattern_changes_what_is_captured() -> None:
    npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)])
    compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True)
    x = torch.randn(5, 2)
    # exp(3x) is what sinh + cosh compute, without their cancellation error for negative x
    # (eager's sinh(-12) + cosh(-12) is off by about cosh(12) x 1e-7 = 1e-2): compared with
    # the rewritten graph's own arithmetic, not with eager's.
    torch.testing.assert_close(compiled(x), exp(x * 3).relu())
    assert kernels_per_replay() == 3  # mul, exp, relu


def test_registering_a_pattern_twice_with_skip_duplicates_is_a_no_op() -> None:
    assert npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)])
    assert not npugraph_ex.register_replacement(
        sinh_plus_cosh, exp, [torch.randn(4)], skip_duplicates=True
    )


def test_a_given_search_pattern_is_matched_instead_of_the_traced_search_fn(traced) -> None:
    # TorchAir's and Inductor's search_fn_pattern: the pattern is matched, search_fn (a tanh
    # here, found nowhere in the model) only names the arguments.
    from torch._inductor.pattern_matcher import CallFunction, KeywordArg

    x = KeywordArg("x")
    pattern = CallFunction(
        aten.add.Tensor, CallFunction(aten.sinh.default, x), CallFunction(aten.cosh.default, x)
    )

    def tanh(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)

    assert npugraph_ex.register_replacement(tanh, exp, [torch.randn(4)], search_fn_pattern=pattern)
    graph = traced(model, torch.randn(2, 3))
    fuse_patterns(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.exp.default"] == 1 and "aten.sinh.default" not in counts


def test_a_failing_extra_check_keeps_the_graph(traced) -> None:
    seen = []

    def refuse(match) -> bool:
        seen.append(match)
        return False

    npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)], extra_check=refuse)
    graph = traced(model, torch.randn(2, 3))
    before = graph.op_counts()
    fuse_patterns(graph.gm, graph.inputs, Config())
    assert seen and graph.op_counts() == before


def test_the_option_turns_the_pass_off(traced) -> None:
    npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4)])
    graph = traced(model, torch.randn(2, 3))
    gm = PassManager(PIPELINE, Config(pattern_fusion_pass=False))(graph.gm, graph.inputs)
    assert sum(1 for n in gm.graph.nodes if n.target is aten.sinh.default) == 1


def double_then_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2 + y


def add_twice(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.add(x, y, alpha=1) + x


def doubled_in_scope(x, y):
    with stream("branch"):
        d = x * 2
    return (d + y).relu()


def doubled_with_scope(x, y):
    with stream("branch"):
        d = x * 2 + y
    return d.relu()


@torch.no_grad()
def test_a_user_pattern_stops_at_a_scope_edge_whatever_its_extra_check_says(traced) -> None:
    x, y = torch.randn(8), torch.randn(8)
    npugraph_ex.register_replacement(
        double_then_add, add_twice, [x, y], extra_check=lambda match: True, skip_duplicates=True
    )
    spanning = traced(doubled_in_scope, x, y)
    fuse_patterns(spanning.gm, spanning.inputs, Config())
    assert spanning.op_counts()["aten.mul.Tensor"] == 1
    inside = traced(doubled_with_scope, x, y)
    fuse_patterns(inside.gm, inside.inputs, Config())
    assert inside.op_counts()["aten.mul.Tensor"] == 0
    assert inside.op_counts()["aten.add.Tensor"] == 2
    torch.testing.assert_close(inside.run(x, y)[0], doubled_with_scope(x, y))


def added(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def subtracted_twice(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x - y - y


def test_an_argument_the_pattern_leaves_out_must_hold_its_default(traced) -> None:
    # The matcher compares only the keyword arguments the pattern names: without the check,
    # x + y would match add(x, y, alpha=2) and its replacement would drop the alpha.
    x, y = torch.randn(8), torch.randn(8)
    npugraph_ex.register_replacement(added, subtracted_twice, [x, y])
    scaled = traced(lambda x, y: torch.add(x, y, alpha=2), x, y)
    fuse_patterns(scaled.gm, scaled.inputs, Config())
    assert scaled.op_counts()["aten.add.Tensor"] == 1 and scaled.op_counts()["aten.sub.Tensor"] == 0
    at_default = traced(lambda x, y: torch.add(x, y, alpha=1), x, y)
    fuse_patterns(at_default.gm, at_default.inputs, Config())
    assert at_default.op_counts()["aten.sub.Tensor"] == 2


def scaled_exp(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.exp(x) * scale


def test_functions_of_different_arities_are_refused_at_registration() -> None:
    patterns_before = {key: len(entries) for key, entries in registry().patterns.items()}
    with pytest.raises(TypeError) as error:
        npugraph_ex.register_replacement(sinh_plus_cosh, scaled_exp, [torch.randn(4)])
    assert str(error.value) == (
        "register_replacement: search function sinh_plus_cosh() takes 1 argument but "
        "replacement function scaled_exp() takes 2 arguments; both must take the same "
        "arguments, in the same order (the replacement is called with what the search function "
        "bound)"
    )
    assert {key: len(entries) for key, entries in registry().patterns.items()} == patterns_before


def test_example_inputs_must_match_the_arguments() -> None:
    with pytest.raises(TypeError) as error:
        npugraph_ex.register_replacement(sinh_plus_cosh, exp, [torch.randn(4), torch.randn(4)])
    assert str(error.value) == (
        "register_replacement: search function sinh_plus_cosh() takes 1 argument but 2 example "
        "inputs were given; give one example input per argument not named in scalar_workaround, "
        "and name each argument that takes a number there: scalar_workaround={name: example value}"
    )


def exp_in_double(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x.double())


def exp_and_its_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.exp(x), x


@pytest.mark.parametrize(
    ("replace", "returns"),
    [
        (exp_in_double, "float64 [4] on cpu"),
        (exp_and_its_input, "(float32 [4] on cpu, float32 [4] on cpu)"),
    ],
    ids=["another dtype", "another count"],
)
def test_a_replacement_that_returns_other_results_is_refused_at_registration(
    replace, returns
) -> None:  # noqa: ANN001
    patterns_before = {key: len(entries) for key, entries in registry().patterns.items()}
    with pytest.raises(TypeError) as error:
        npugraph_ex.register_replacement(sinh_plus_cosh, replace, [torch.randn(4)])
    assert str(error.value) == (
        f"register_replacement: for the example inputs, replacement function {replace.__name__}() "
        f"returns {returns} where search function sinh_plus_cosh() returns float32 [4] on cpu; "
        "the replacement must return the same results (as many, each of the same shape, dtype "
        "and device): the graph past a match was traced on the search function's"
    )
    assert {key: len(entries) for key, entries in registry().patterns.items()} == patterns_before


def scaled_sinh_plus_cosh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (torch.sinh(x) + torch.cosh(x)) * scale


def scaled_exp_of(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.exp(x) * scale


def halved_model(x: torch.Tensor) -> torch.Tensor:
    return scaled_sinh_plus_cosh(x * 3, 0.5).relu()


@torch.no_grad()
def test_a_number_argument_named_in_scalar_workaround_is_bound_from_the_graph(traced) -> None:
    assert npugraph_ex.register_replacement(
        scaled_sinh_plus_cosh, scaled_exp_of, [torch.randn(4)], scalar_workaround={"scale": 0.1}
    )
    graph = traced(halved_model, torch.randn(2, 3))
    before = graph.op_counts()
    fuse_patterns(graph.gm, graph.inputs, Config())
    after = graph.op_counts()
    assert before["aten.sinh.default"] == before["aten.cosh.default"] == 1
    assert "aten.sinh.default" not in after and "aten.cosh.default" not in after
    assert after["aten.exp.default"] == 1 and after["aten.mul.Tensor"] == 2
    (scaled,) = (n for n in graph.gm.graph.nodes if n.target is aten.mul.Tensor and 0.5 in n.args)
    assert scaled.args[0].target is aten.exp.default  # the graph's 0.5, not the example's 0.1

    compiled = torch.compile(halved_model, backend="npugraph_ex", fullgraph=True)
    x = torch.randn(5, 2)
    assert torch.equal(compiled(x), (torch.exp(x * 3) * 0.5).relu())  # the replacement, exactly
    assert kernels_per_replay() == 4  # mul, exp, mul, relu


def clamp_twice(low: float, x: torch.Tensor, high: float) -> torch.Tensor:
    return torch.clamp_max(torch.clamp_min(x, low), high)


def clamp_once(low: float, x: torch.Tensor, high: float) -> torch.Tensor:
    return torch.clamp(x, low, high)


def clamped_model(x: torch.Tensor) -> torch.Tensor:
    return clamp_twice(-0.5, x * 2, 0.75) + 1


@torch.no_grad()
def test_several_number_arguments_bind_in_any_position(traced) -> None:
    assert npugraph_ex.register_replacement(
        clamp_twice, clamp_once, [torch.randn(4)], scalar_workaround={"low": -0.25, "high": 0.3}
    )
    graph = traced(clamped_model, torch.randn(3, 4))
    fuse_patterns(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert "aten.clamp_min.default" not in counts and "aten.clamp_max.default" not in counts
    (clamp,) = graph.gm.graph.find_nodes(op="call_function", target=aten.clamp.default)
    assert clamp.args[1:] == (-0.5, 0.75)

    compiled = torch.compile(clamped_model, backend="npugraph_ex", fullgraph=True)
    x = torch.randn(6, 4)
    assert torch.equal(compiled(x), clamped_model(x))
    assert kernels_per_replay() == 3  # mul, clamp, add


@pytest.mark.parametrize(
    "inputs",
    [
        pytest.param(lambda x: [x], id="one-per-unnamed-argument"),
        pytest.param(lambda x: [-0.25, x, 0.3], id="one-per-argument"),
    ],
)
def test_example_inputs_may_hold_the_named_numbers_in_their_places_or_leave_them_out(
    traced, inputs
) -> None:
    npugraph_ex.register_replacement(
        clamp_twice,
        clamp_once,
        inputs(torch.randn(4)),
        scalar_workaround={"low": -0.25, "high": 0.3},
    )
    graph = traced(clamped_model, torch.randn(3, 4))
    fuse_patterns(graph.gm, graph.inputs, Config())
    (clamp,) = graph.gm.graph.find_nodes(op="call_function", target=aten.clamp.default)
    assert clamp.args[1:] == (-0.5, 0.75)


@pytest.mark.parametrize(
    ("search", "replace", "inputs", "numbers", "message"),
    [
        pytest.param(
            scaled_sinh_plus_cosh,
            scaled_exp_of,
            [torch.randn(4)],
            None,
            "search function scaled_sinh_plus_cosh() takes 2 arguments but 1 example input was "
            "given; give one example input per argument not named in scalar_workaround, and name "
            "each argument that takes a number there: scalar_workaround={name: example value}",
            id="a-number-argument-not-named",
        ),
        pytest.param(
            clamp_twice,
            clamp_once,
            [torch.randn(4), torch.randn(4)],
            {"low": -0.25, "high": 0.3},
            "search function clamp_twice() takes 3 arguments, 2 of them named in "
            "scalar_workaround (low, high), so it needs 1 example input, but 2 example inputs "
            "were given; give one example input per argument not named in scalar_workaround",
            id="too-many-example-inputs",
        ),
        pytest.param(
            clamp_twice,
            clamp_once,
            [-0.25, torch.randn(4), torch.randn(4)],
            {"low": -0.25, "high": 0.3},
            "search function clamp_twice() takes 3 arguments, 2 of them named in "
            "scalar_workaround (low, high), so it needs 1 example input, but 3 example inputs "
            "were given",
            id="a-tensor-in-a-named-place",
        ),
        pytest.param(
            scaled_sinh_plus_cosh,
            scaled_exp_of,
            [torch.randn(4)],
            {"scal": 0.1},
            "scalar_workaround names 'scal', which is not an argument of search function "
            "scaled_sinh_plus_cosh() (its arguments: x, scale); name the arguments that take a "
            "number",
            id="not-an-argument",
        ),
        pytest.param(
            scaled_sinh_plus_cosh,
            scaled_exp_of,
            [torch.randn(4)],
            {"scale": torch.tensor(0.1)},
            "scalar_workaround['scale'] must be a float or an int (the example value of a number "
            "argument), got Tensor",
            id="not-a-number",
        ),
        pytest.param(
            clamp_twice,
            clamp_once,
            [torch.randn(4)],
            {"low": 0.5, "high": 0.5},
            "scalar_workaround gives 'low' and 'high' the same example value 0.5; give each a "
            "different value (the pattern tells number arguments apart by their example values)",
            id="one-value-twice",
        ),
    ],
)
def test_a_wrong_scalar_workaround_is_refused_naming_the_fix(
    search, replace, inputs, numbers, message
) -> None:
    patterns_before = {key: len(entries) for key, entries in registry().patterns.items()}
    with pytest.raises(TypeError) as error:
        npugraph_ex.register_replacement(search, replace, inputs, scalar_workaround=numbers)
    assert str(error.value).startswith("register_replacement: ")
    assert message in str(error.value)
    assert {key: len(entries) for key, entries in registry().patterns.items()} == patterns_before


def pairs_summed(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1] // 2, 2).sum(-1)


def pairs_added(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0::2] + x[:, 1::2]


def sums_of_fours(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1] // 4, 4).sum(-1)


@torch.no_grad()
@pytest.mark.parametrize(("model", "applies"), [(pairs_summed, True), (sums_of_fours, False)])
def test_a_pattern_of_sizes_is_matched_and_rechecked_with_every_symbol(
    traced, model, applies
) -> None:
    # With dynamic shapes rows and columns are two symbols of the pattern's view; its re-check
    # traces it with both as inputs, and refuses a graph whose constants differ (sums of fours
    # match the pattern with its sizes ignored, not the pattern of the graph's own sizes).
    npugraph_ex.register_replacement(pairs_summed, pairs_added, [torch.randn(3, 8)])
    graph = traced(model, torch.randn(5, 12), dynamic=True)
    assert len([n for n in graph.gm.graph.nodes if n.op == "placeholder"]) == 3  # two symbols
    fuse_patterns(graph.gm, graph.inputs, Config())
    counts = graph.op_counts()
    assert counts["aten.sum.dim_IntList"] == (0 if applies else 1)
    assert counts["aten.add.Tensor"] == (1 if applies else 0)

    compiled = torch.compile(model, backend="npugraph_ex", dynamic=True)
    for rows in (5, 7):
        x = torch.randn(rows, 12)
        assert torch.equal(compiled(x), model(x))
