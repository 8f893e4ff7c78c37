"""Tensor dumps: which calls and nodes are written, what each file holds, and how the call ran."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

import npugraph_ex
from npugraph_ex.config import Config
from npugraph_ex.debug.dump_files import dump_folders, read_dump
from npugraph_ex.errors import ConfigError, ConfigTypeError


class AddInto(torch.nn.Module):
    """A linear layer, a relu whose memory a replay reuses, and a buffer written in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("total", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x).relu()
        self.total.add_(y.sum(0))
        return (y * 2 + x).sum(-1)


def compiled(model: torch.nn.Module, root: Path, **options: Any) -> Any:
    options = {"dump_tensor_data": True, "data_dump_dir": str(root), **options}
    return torch.compile(model, backend="npugraph_ex", options=options)


def run(fn: Any, calls: int) -> list[torch.Tensor]:
    torch.manual_seed(1)
    with torch.no_grad():
        return [fn(torch.randn(4, 8)).clone() for _ in range(calls)]


def by_origin(dump: Any) -> dict[str, torch.Tensor]:
    return {n.origin: dump.tensor(n.outputs[0]) for n in dump.nodes if n.outputs[0].file}


@pytest.fixture
def models() -> tuple[AddInto, AddInto]:
    torch.manual_seed(0)
    model = AddInto()
    reference = AddInto()
    reference.load_state_dict(model.state_dict())
    return model, reference


def test_replayed_calls_dump_every_node_as_its_kernels_left_it(
    tmp_path: Path, models: tuple[AddInto, AddInto]
) -> None:
    model, reference = models
    got = run(compiled(model, tmp_path, data_dump_calls="1-2"), 4)
    want = run(reference, 4)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert torch.equal(model.total, reference.total)  # every call wrote the buffer once
    folders = dump_folders(tmp_path)
    assert [f.relative_to(tmp_path).as_posix() for f in folders] == [
        "rank0/graph[0_0]/optimized/key0/call0001",
        "rank0/graph[0_0]/optimized/key0/call0002",
    ]
    dump = read_dump(folders[0])
    assert (dump.graph, dump.stage, dump.key, dump.call, dump.how) == (
        "graph[0/0]", "optimized", "key0", 1, "replay",
    )  # fmt: skip
    tensors = [o for n in dump.nodes for o in n.outputs if o.file]
    assert len(list(folders[0].glob("*.pt"))) == len(tensors) >= 8
    assert [n.order for n in dump.nodes] == sorted(n.order for n in dump.nodes)
    values = by_origin(dump)
    torch.manual_seed(1)
    xs = [torch.randn(4, 8) for _ in range(2)]
    with torch.no_grad():
        relu = reference.lin(xs[1]).relu()
    assert torch.equal(values["relu"], relu)  # read before a later kernel reused its bytes
    assert torch.equal(values["sum_2"], want[1])
    relu_node = next(n for n in dump.nodes if n.origin == "relu")
    assert relu_node.op == "aten.relu_.default" and "relu()" in relu_node.source
    graph = npugraph_ex.stats()["graphs"][-1]
    assert (graph["captures"], graph["replays"], graph["eager_calls"]) == (1, 3, {})


def test_filters_keep_a_dump_to_the_chosen_nodes(
    tmp_path: Path, models: tuple[AddInto, AddInto]
) -> None:
    options = {"data_dump_calls": "0", "data_dump_nodes": ["aten.addmm.*", "sum_*"]}
    run(compiled(models[0], tmp_path, **options), 2)
    [folder] = dump_folders(tmp_path)
    dump = read_dump(folder)
    assert [(n.name, n.op) for n in dump.nodes] == [
        ("addmm", "aten.addmm.default"), ("sum_1", "aten.sum.dim_IntList"),
        ("sum_2", "aten.sum.dim_IntList"),
    ]  # fmt: skip
    assert len(list(folder.glob("*.pt"))) == 3


def test_the_original_stage_runs_the_graph_before_the_passes(
    tmp_path: Path, models: tuple[AddInto, AddInto]
) -> None:
    model, reference = models
    original, optimized = tmp_path / "original", tmp_path / "optimized"
    original.mkdir(), optimized.mkdir()
    run(compiled(model, original, data_dump_stage="original", data_dump_calls="0"), 1)
    run(compiled(reference, optimized, data_dump_calls="0"), 1)
    before, after = read_dump(original), read_dump(optimized)
    assert (before.stage, before.key, before.how) == ("original", "eager", "eager")
    ops = {n.name: n.op for n in before.nodes}
    assert ops["relu"] == "aten.relu.default" and ops["add"] == "aten.add.Tensor"
    removed = {n.origin for n in before.nodes} - {n.origin for n in after.nodes}
    assert removed == {"copy_"}  # the buffer's write-back: written in place after the passes
    a, b = by_origin(before), by_origin(after)
    assert all(torch.equal(a[name], b[name]) for name in b)


def test_a_graph_whose_replay_cannot_be_read_is_dumped_node_by_node(
    tmp_path: Path, models: tuple[AddInto, AddInto], caplog: pytest.LogCaptureFixture
) -> None:
    model, reference = models
    with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        got = run(compiled(model, tmp_path, force_eager=True, data_dump_calls="0|2"), 3)
    assert all(torch.equal(a, b) for a, b in zip(got, run(reference, 3), strict=True))
    assert torch.equal(model.total, reference.total)
    dumps = [read_dump(f) for f in dump_folders(tmp_path)]
    assert [(d.key, d.call, d.how) for d in dumps] == [("eager", 0, "eager"), ("eager", 2, "eager")]
    warnings = [r.getMessage() for r in caplog.records if "node by node" in r.getMessage()]
    assert warnings == [
        "npugraph_ex: graph[0/0]: dumped calls run the graph node by node, not its replay "
        "(force_eager)"
    ]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"data_dump_calls": "3-1"},
            ConfigError,
            "data_dump_calls must be calls such as '0|2-4' (cannot read '3-1': write calls as "
            "'N' or 'N-M' joined by '|'), got '3-1' (options={'data_dump_calls': '3-1'})",
        ),
        (
            {"data_dump_nodes": 3},
            ConfigTypeError,
            "data_dump_nodes must be a list or tuple of patterns (str), or one str of them, "
            "got 3 (options={'data_dump_nodes': 3})",
        ),
    ],
)
def test_bad_filters_name_the_fix(options: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error) as raised:
        Config.from_options(options)
    assert str(raised.value) == message


def test_a_str_of_node_patterns_is_split_as_torchair_writes_dump_layers() -> None:
    assert Config.from_options({"data_dump_nodes": "mm_1  add_*"}).data_dump_nodes == (
        "mm_1",
        "add_*",
    )
