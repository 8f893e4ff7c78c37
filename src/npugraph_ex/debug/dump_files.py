"""The on-disk form of a tensor dump: one folder per dumped call, an index and one file per tensor.

    <data_dump_dir>/rank<r>/<graph>/<stage>/<key>/call<NNNN>/
        index.json                 graph, stage, key, call, how it ran, and per node in graph
                                   order: name, op, the user's source line, and its outputs
        00012_mm_0.pt              one tensor per file (``torch.save`` of a contiguous CPU copy)

``<graph>`` is the graph's name with ``/`` written ``_`` (``graph[0_0]``), ``<stage>`` is
``original`` or ``optimized``, ``<key>`` is the capture key's label (``key0``) or ``eager`` for a
call that ran without a capture. An output that is not a tensor (an int, None) is recorded in
the index by its ``repr``. The index is written last: a folder without one is an unfinished dump.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

INDEX = "index.json"
FORMAT = 1


class DumpError(ValueError):
    """A dump path that cannot be read; the message names the path and the fix."""


@dataclass
class DumpedOutput:
    """One output of a node: a tensor's file and layout, or another value's ``repr``."""

    file: str | None = None
    shape: list[int] | None = None
    dtype: str | None = None
    stride: list[int] | None = None
    value: str | None = None


@dataclass
class DumpedNode:
    order: int
    """Position in the dumped graph's node order (placeholders included)."""
    name: str
    op: str
    """``placeholder``, or the call target (``aten.mm.default``)."""
    source: str
    """The user's source line the node came from."""
    outputs: list[DumpedOutput] = field(default_factory=list)
    origin: str = ""
    """The name of the node of the graph before the passes that this node computes (a pass that
    rewrites a node in place keeps its origin); the node's own name where it has none."""


@dataclass
class DumpIndex:
    graph: str
    stage: str
    key: str
    call: int
    how: str
    """``replay`` (values read from the replayed device graph after each node's kernels) or
    ``eager`` (the graph run node by node)."""
    rank: int
    nodes: list[DumpedNode] = field(default_factory=list)
    format: int = FORMAT
    path: Path | None = None
    """The folder the index was read from (not stored)."""

    def tensor(self, output: DumpedOutput) -> torch.Tensor:
        """The tensor of ``output``, loaded from its file."""
        if output.file is None or self.path is None:
            raise DumpError(f"{output!r} is not a dumped tensor")
        return torch.load(self.path / output.file, weights_only=True)


def call_folder(
    root: str | os.PathLike[str], rank: int, graph: str, stage: str, key: str, call: int
) -> Path:
    return Path(root) / f"rank{rank}" / graph.replace("/", "_") / stage / key / f"call{call:04d}"


def file_name(order: int, node_name: str, position: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", node_name)
    return f"{order:05d}_{safe}_{position}.pt"


def dumped_output(folder: Path, name: str, value: Any) -> DumpedOutput:
    """Write ``value`` under ``folder`` as ``name`` if it is a tensor; its index entry."""
    if not isinstance(value, torch.Tensor):
        return DumpedOutput(value=repr(value))
    copy = value.detach().to("cpu", copy=True).contiguous()
    torch.save(copy, folder / name)
    return DumpedOutput(
        file=name, shape=list(value.shape), dtype=str(value.dtype), stride=list(value.stride())
    )


def write_index(index: DumpIndex, folder: Path) -> None:
    """``index.json`` in ``folder``, written whole or not at all."""
    data = asdict(index)
    data.pop("path")
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".index.", suffix=".json")
    with os.fdopen(descriptor, "w") as stream:
        json.dump(data, stream, indent=1)
    os.replace(temporary, folder / INDEX)


def dump_folders(path: str | os.PathLike[str]) -> list[Path]:
    """Every finished dump at or under ``path``, in path order."""
    root = Path(path)
    if (root / INDEX).is_file():
        return [root]
    return sorted(p.parent for p in root.rglob(INDEX))


def read_dump(path: str | os.PathLike[str]) -> DumpIndex:
    """The dump at ``path``: a call folder, or a folder that holds exactly one dump."""
    root = Path(path)
    if not root.exists():
        raise DumpError(f"{root}: no such dump folder")
    folders = dump_folders(root)
    if not folders:
        raise DumpError(
            f"{root}: no dump here (no {INDEX} at or under it); dump with "
            "options={'dump_tensor_data': True, 'data_dump_dir': ...}"
        )
    if len(folders) > 1:
        shown = "\n  ".join(str(f) for f in folders[:10])
        more = f"\n  ... and {len(folders) - 10} more" if len(folders) > 10 else ""
        raise DumpError(f"{root} holds {len(folders)} dumps; name one of:\n  {shown}{more}")
    folder = folders[0]
    try:
        data = json.loads((folder / INDEX).read_text())
        nodes = [
            DumpedNode(**{**n, "outputs": [DumpedOutput(**o) for o in n["outputs"]]})
            for n in data.pop("nodes")
        ]
        index = DumpIndex(**data, nodes=nodes, path=folder)
    except (ValueError, TypeError, KeyError) as error:
        raise DumpError(f"{folder / INDEX}: not a dump index ({error})") from error
    if index.format != FORMAT:
        raise DumpError(
            f"{folder / INDEX}: dump format {index.format}, this version reads {FORMAT}"
        )
    return index
