"""The pass manager: order, options, disabling by name, errors naming the pass, dumps."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import npugraph_ex
from helpers import graphs_called
from npugraph_ex.config import Config
from npugraph_ex.errors import ConfigError, PassError
from npugraph_ex.passes.manager import PassManager
from npugraph_ex.passes.pipeline import PIPELINE

aten = torch.ops.aten


def op_count(gm: torch.fx.GraphModule, target) -> int:
    return sum(1 for node in gm.graph.nodes if node.target is target)


def add_then_mul(x: torch.Tensor) -> torch.Tensor:
    return (x + 1) * 3


def add_to_sub(gm: torch.fx.GraphModule, example_inputs, config) -> None:
    for node in gm.graph.nodes:
        if node.target is aten.add.Tensor:
            node.target = aten.sub.Tensor


def test_custom_passes_run_in_order_with_gm_inputs_and_config() -> None:
    calls = []

    def pre(gm, example_inputs, config):
        calls.append(("pre", len(example_inputs), type(config).__name__))

    def post(gm, example_inputs, config):
        calls.append(("post", op_count(gm, aten.mul.Tensor), config.capture_limit))

    config = Config.from_options(
        {"post_grad_custom_pre_pass": pre, "post_grad_custom_post_pass": post, "capture_limit": 7}
    )
    x = torch.randn(3)
    PassManager(PIPELINE, config)(make_fx(add_then_mul)(x), [x])
    assert calls == [("pre", 1, "Config"), ("post", 1, 7)]


@torch.no_grad()
def test_a_custom_pass_changes_what_is_captured() -> None:
    fn = torch.compile(
        add_then_mul,
        backend="npugraph_ex",
        fullgraph=True,
        options={"post_grad_custom_pre_pass": add_to_sub},
    )
    x = torch.randn(4)
    assert torch.equal(fn(x), (x - 1) * 3)
    assert torch.equal(fn(x), (x - 1) * 3)
    assert npugraph_ex.stats()["totals"]["replays"] == 1


def test_a_pass_can_be_disabled_by_name() -> None:
    x = torch.randn(3)
    gm = make_fx(add_then_mul)(x)
    config = Config.from_options(
        {"post_grad_custom_pre_pass": add_to_sub, "disabled_passes": ["post_grad_custom_pre_pass"]}
    )
    manager = PassManager(PIPELINE, config)
    assert "post_grad_custom_pre_pass" not in [p.name for p in manager.selected()]
    gm = manager(gm, [x])
    assert op_count(gm, aten.add.Tensor) == 1
    assert op_count(gm, aten.sub.Tensor) == 0


def test_unknown_pass_name_lists_the_valid_ones() -> None:
    config = Config.from_options({"disabled_passes": ["dead_code"]})
    with pytest.raises(ConfigError) as raised:
        PassManager(PIPELINE, config)
    message = str(raised.value)
    assert "disabled_passes names unknown passes ['dead_code']" in message
    assert "dead_code_elimination" in message


def test_a_failing_pass_is_named_in_the_error() -> None:
    def broken(gm, example_inputs, config):
        raise KeyError("no such node")

    x = torch.randn(3)
    config = Config.from_options({"post_grad_custom_post_pass": broken, "strict_passes": True})
    with pytest.raises(PassError) as raised:
        PassManager(PIPELINE, config)(make_fx(add_then_mul)(x), [x])
    assert raised.value.pass_name == "post_grad_custom_post_pass"
    assert str(raised.value) == (
        "pass 'post_grad_custom_post_pass' failed: KeyError: 'no such node'"
    )


def test_a_pass_that_breaks_the_graph_is_caught_and_named() -> None:
    def dangling(gm, example_inputs, config):
        mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
        add = next(n for n in gm.graph.nodes if n.target is aten.add.Tensor)
        add.args = (mul, 1)  # add now uses mul, which is defined after it

    x = torch.randn(3)
    config = Config.from_options({"post_grad_custom_pre_pass": dangling, "strict_passes": True})
    with pytest.raises(PassError, match="pass 'post_grad_custom_pre_pass' failed"):
        PassManager(PIPELINE, config)(make_fx(add_then_mul)(x), [x])


def test_dead_code_is_removed() -> None:
    def with_dead_code(x):
        unused = x.cos()  # noqa: F841
        return x.sin()

    x = torch.randn(3)
    gm = make_fx(with_dead_code)(x)
    assert op_count(gm, aten.cos.default) == 1
    manager = PassManager(PIPELINE, Config())
    gm = manager(gm, [x])
    assert op_count(gm, aten.cos.default) == 0
    assert op_count(gm, aten.sin.default) == 1
    # Custom passes are off without a callable; every built-in pass ran and was timed.
    assert set(manager.seconds) == {p.name for p in PIPELINE if not p.name.startswith("post_grad")}


def test_graphs_are_dumped_after_each_pass(tmp_path) -> None:
    x = torch.randn(3)
    config = Config.from_options(
        {"post_grad_custom_pre_pass": add_to_sub, "debug_dump_dir": str(tmp_path)}
    )
    manager = PassManager(PIPELINE, config, graph_name="graph[0/0]")
    manager(make_fx(add_then_mul)(x), [x])
    folder = tmp_path / "graph[0_0]"
    names = sorted(p.name for p in folder.iterdir())
    ran = [p.name for p in manager.selected()]
    assert ran[:2] == ["native_streams", "post_grad_custom_pre_pass"]
    assert "dead_code_elimination" in ran
    assert names == ["00_input.py"] + [f"{i:02d}_after_{n}.py" for i, n in enumerate(ran, 1)]
    assert "aten.add.Tensor" in (folder / "00_input.py").read_text()
    assert "aten.sub.Tensor" in (folder / "02_after_post_grad_custom_pre_pass.py").read_text()


def raise_on_mul(gm: torch.fx.GraphModule, example_inputs, config) -> None:
    """Rewrites the add, then fails on the mul: a half-applied pass if it were kept."""
    for node in gm.graph.nodes:
        if node.target is aten.add.Tensor:
            node.target = aten.sub.Tensor
        if node.target is aten.mul.Tensor:
            raise ValueError(f"cannot handle {node.name}")


def test_a_failing_pass_leaves_the_graph_as_it_was_before_it(caplog) -> None:
    x = torch.randn(3)
    config = Config.from_options({"post_grad_custom_pre_pass": raise_on_mul})
    manager = PassManager(PIPELINE, config, graph_name="graph[0/0]")
    with caplog.at_level("WARNING", logger="npugraph_ex"):
        gm = manager(make_fx(add_then_mul)(x), [x])
    assert op_count(gm, aten.add.Tensor) == 1 and op_count(gm, aten.sub.Tensor) == 0
    assert torch.equal(gm(x)[0] if isinstance(gm(x), tuple) else gm(x), add_then_mul(x))
    assert manager.failed == ["post_grad_custom_pre_pass"]
    (record,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert record.getMessage().startswith(
        "npugraph_ex: graph[0/0]: pass 'post_grad_custom_pre_pass' failed: "
        "ValueError: cannot handle mul"
    )
    assert "options={'disabled_passes': ['post_grad_custom_pre_pass']}" in record.getMessage()


@torch.no_grad()
def test_a_compile_with_a_failing_pass_runs_names_the_source_line_and_counts_it(caplog) -> None:
    fn = torch.compile(
        add_then_mul,
        backend="npugraph_ex",
        fullgraph=True,
        options={"post_grad_custom_pre_pass": raise_on_mul},
    )
    x = torch.randn(4)
    with caplog.at_level("WARNING", logger="npugraph_ex"):
        assert torch.equal(fn(x), add_then_mul(x))
    assert torch.equal(fn(x), add_then_mul(x))
    (graph,) = graphs_called()
    assert graph["failed_passes"] == {"post_grad_custom_pre_pass": 1}
    assert graph["replays"] == 1
    message = next(r.getMessage() for r in caplog.records if "failed" in r.getMessage())
    assert "(at File " in message and "return (x + 1) * 3" in message


def test_strict_passes_raises_the_pass_error() -> None:
    fn = torch.compile(
        add_then_mul,
        backend="npugraph_ex",
        fullgraph=True,
        options={"post_grad_custom_pre_pass": raise_on_mul, "strict_passes": True},
    )
    with pytest.raises(Exception, match="pass 'post_grad_custom_pre_pass' failed: ValueError"):
        fn(torch.randn(4))
