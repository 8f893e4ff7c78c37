"""The dump comparer and ``npugraph-ex compare``: the first node where two dumps differ."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from npugraph_ex.cli import main as cli_main
from npugraph_ex.debug.dump_files import (
    DumpedNode,
    DumpError,
    DumpIndex,
    dump_folders,
    dumped_output,
    write_index,
)
from npugraph_ex.tools.compare import compare_dumps

aten = torch.ops.aten


def scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = (x @ w).relu()
    z = y * 2
    return (z + x).sum(-1)


def doubled_a_little_more(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    """A wrong rewrite: ``y * 2`` becomes ``y * 2.001``."""
    for node in gm.graph.nodes:
        if node.target is aten.mul.Tensor and node.args[1] == 2:
            node.args = (node.args[0], 2.001)


def dumped(root: Path, **options: Any) -> Path:
    """Compile ``scaled`` with dumps of its first call under ``root``; that call's folder."""
    root.mkdir(parents=True)
    dumps = {"dump_tensor_data": True, "data_dump_dir": str(root), "data_dump_calls": "0"}
    torch._dynamo.reset()
    fn = torch.compile(scaled, backend="npugraph_ex", options={**dumps, **options})
    torch.manual_seed(0)
    with torch.no_grad():
        fn(torch.randn(4, 8), torch.randn(8, 8))
    [folder] = dump_folders(root)
    return folder


@pytest.fixture
def eager_and_wrong(tmp_path: Path) -> tuple[Path, Path]:
    original = dumped(tmp_path / "original", data_dump_stage="original")
    wrong = dumped(tmp_path / "wrong", post_grad_custom_post_pass=doubled_a_little_more)
    return original, wrong


def test_the_first_divergence_is_the_rewritten_node(eager_and_wrong: tuple[Path, Path]) -> None:
    comparison = compare_dumps(*eager_and_wrong)
    first = comparison.first_divergence
    assert (first.origin, first.name_b, first.op_b) == ("mul", "mul__tensor", "aten.mul_.Tensor")
    assert "z = y * 2" in first.source
    assert first.max_abs > 0 and first.max_rel == pytest.approx(0.0005, rel=1e-3)
    names = [row.origin for row in comparison.rows]
    assert names[: names.index("mul")] == ["arg0_1", "arg1_1", "mm", "relu"]
    assert all(row.ok for row in comparison.rows[: names.index("mul")])
    assert comparison.only_a == [] and comparison.only_b == []
    report = comparison.report()
    assert "first divergence: node mul (B: mul__tensor) (aten.mul_.Tensor) at " in report
    assert "<- differs" in report


def test_the_stages_of_a_right_graph_agree(tmp_path: Path) -> None:
    original = dumped(tmp_path / "original", data_dump_stage="original")
    replayed = dumped(tmp_path / "replayed")
    comparison = compare_dumps(original, replayed)
    assert comparison.first_divergence is None and len(comparison.rows) == 7
    assert "no divergence: 7 nodes compared, all within tolerance (atol=1e-05, rtol=0.0001)" in (
        comparison.report()
    )
    assert compare_dumps(original, replayed, atol=0, rtol=0).first_divergence is None


def test_the_command_exits_one_on_a_divergence_and_plots(
    eager_and_wrong: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    plot = tmp_path / "errors.png"
    status = cli_main(["compare", *map(str, eager_and_wrong), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert status == 1 and "first divergence: node mul" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli_main(["compare", str(eager_and_wrong[0]), str(eager_and_wrong[0])]) == 0
    assert "no divergence" in capsys.readouterr().out


def test_bad_dumps_are_clear_errors(
    eager_and_wrong: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    original, wrong = eager_and_wrong
    assert cli_main(["compare", str(tmp_path / "nowhere"), str(wrong)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"npugraph-ex compare: {tmp_path / 'nowhere'}: no such dump folder"
    )
    both = tmp_path / "both"
    shutil.copytree(original, both / "a")
    shutil.copytree(wrong, both / "b")
    with pytest.raises(DumpError) as error:
        compare_dumps(both, wrong)
    assert str(error.value) == f"{both} holds 2 dumps; name one of:\n  {both / 'a'}\n  {both / 'b'}"
    other = tmp_path / "other" / "rank0" / "graph[1_0]"
    shutil.copytree(wrong, other)
    index = other / "index.json"
    index.write_text(index.read_text().replace('"graph[0/0]"', '"graph[1/0]"'))
    with pytest.raises(DumpError) as error:
        compare_dumps(original, other)
    assert str(error.value) == (
        f"the dumps are of different graphs (graph[0/0] in {original}, graph[1/0] in {other}); "
        "compare two dumps of one graph"
    )


def filled(x: torch.Tensor) -> torch.Tensor:
    return x + torch.empty_like(x).fill_(1.0)


def test_nodes_that_only_allocate_are_not_compared(tmp_path: Path) -> None:
    folders = []
    for stage in ("original", "optimized"):
        root = tmp_path / stage
        root.mkdir()
        options = {"dump_tensor_data": True, "data_dump_dir": str(root), "data_dump_stage": stage}
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(filled, backend="npugraph_ex", options=options)(torch.ones(3))
        [folder] = dump_folders(root)
        folders.append(folder)
    comparison = compare_dumps(*folders)
    assert any(node.op == "aten.empty_like.default" for node in comparison.a.nodes)
    ops = [row.op_b for row in comparison.rows]
    assert not any(op.startswith("aten.empty_like") for op in ops) and len(ops) >= 2
    assert comparison.first_divergence is None


def written_dump(folder: Path, nodes: dict[str, torch.Tensor]) -> Path:
    """A dump of graph[0/0] holding ``nodes`` (name: value), as the dumper writes one."""
    folder.mkdir(parents=True)
    index = DumpIndex("graph[0/0]", "optimized", "key0", 0, "replay", 0)
    for order, (name, value) in enumerate(nodes.items()):
        output = dumped_output(folder, f"{order:05d}_{name}_0.pt", value)
        index.nodes.append(DumpedNode(order, name, "aten.add.Tensor", "<unknown source>", [output]))
    write_index(index, folder)
    return folder


def test_nan_infinity_and_layout_mismatches_are_divergences(tmp_path: Path) -> None:
    nan, inf = float("nan"), float("inf")
    a = written_dump(tmp_path / "a", {
        "same": torch.tensor([1.0, nan, inf]), "nan": torch.tensor([1.0, nan]),
        "inf": torch.tensor([1.0, inf]), "shape": torch.zeros(2),
    })  # fmt: skip
    b = written_dump(tmp_path / "b", {
        "same": torch.tensor([1.0, nan, inf]), "nan": torch.tensor([1.0, 2.0]),
        "inf": torch.tensor([1.0, -inf]), "shape": torch.zeros(3),
    })  # fmt: skip
    rows = {row.name_a: row for row in compare_dumps(a, b).rows}
    assert rows["same"].ok and rows["same"].max_abs == 0.0
    assert not rows["nan"].ok and rows["nan"].max_abs == float("inf")
    assert rows["nan"].note == "NaN or infinity in 1 elements where the other dump differs"
    assert not rows["inf"].ok and rows["inf"].note.startswith("NaN or infinity in 1 elements")
    assert not rows["shape"].ok
    assert rows["shape"].note == "(2,) torch.float32 against (3,) torch.float32"


def test_dumps_without_a_node_in_common_are_an_error(tmp_path: Path) -> None:
    a = written_dump(tmp_path / "a", {"x": torch.zeros(2)})
    b = written_dump(tmp_path / "b", {"y": torch.zeros(2)})
    with pytest.raises(DumpError) as error:
        compare_dumps(a, b)
    assert (
        str(error.value) == f"{a} and {b} have no node in common; were they dumped from one graph?"
    )
