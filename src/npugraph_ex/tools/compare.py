"""The dump comparer: where two dumps of one graph part ways, and by how much along the graph.

Nodes are aligned on their origin (the node of the graph before the passes that they compute;
see ``dump.ORIGIN``), so a dump of the ``original`` stage run eagerly lines up with one of the
``optimized`` stage replayed, and two dumps under different options line up with each other.
Nodes are walked in the first dump's order; of two nodes with one origin (a value rewritten in
place), the later one is compared; nodes that only allocate (``empty``) are not. Each tensor
output is compared in float64 as ``torch.isclose`` does: ``|a - b| <= atol + rtol * |b|``, NaN
equal to NaN.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.debug.dump_files import DumpedNode, DumpError, DumpIndex, read_dump

UNINITIALISED = ("aten.empty", "aten.empty_strided", "aten.empty_like", "aten.new_empty")
"""Ops whose outputs hold whatever the memory held: never compared."""

ROWS_AROUND = 5
"""Rows shown before and after the first divergence in a shortened table."""
WORST_ROWS = 5
"""The largest errors shown in a shortened table, wherever they are."""


@dataclass
class Row:
    """One aligned node: the first dump's node and the second's."""

    order: int
    origin: str
    name_a: str
    name_b: str
    op_b: str
    source: str
    shape: str
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


@dataclass
class Comparison:
    a: DumpIndex
    b: DumpIndex
    rtol: float
    atol: float
    rows: list[Row] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)

    @property
    def first_divergence(self) -> Row | None:
        return next((row for row in self.rows if not row.ok), None)

    def report(self, limit: int | None = 40) -> str:
        """The verdict and the error along the graph; with ``limit``, a longer table is cut to
        the rows around the first divergence and the largest errors."""
        lines = [f"A: {describe(self.a)}", f"B: {describe(self.b)}"]
        first = self.first_divergence
        tolerance = f"(atol={self.atol:g}, rtol={self.rtol:g})"
        if first is None:
            lines.append(
                f"no divergence: {len(self.rows)} nodes compared, all within tolerance {tolerance}"
            )
        else:
            renamed = f" (B: {first.name_b})" if first.name_b != first.name_a else ""
            lines.append(
                f"first divergence: node {first.name_a}{renamed} ({first.op_b}) at "
                f"{first.source}: max abs error {first.max_abs:.3g}, max rel error "
                f"{first.max_rel:.3g} {tolerance}{'; ' + first.note if first.note else ''}"
            )
        lines.append(
            f"{len(self.rows)} nodes compared; {len(self.only_a)} only in A, "
            f"{len(self.only_b)} only in B (rewritten by the passes)"
        )
        lines.append("")
        lines.extend(self.table(limit))
        return "\n".join(lines)

    def table(self, limit: int | None) -> list[str]:
        rows = self.rows
        shown = set(range(len(rows)))
        if limit is not None and len(rows) > limit:
            first = next((i for i, row in enumerate(rows) if not row.ok), 0)
            worst = sorted(range(len(rows)), key=lambda i: -rows[i].max_abs)[:WORST_ROWS]
            shown = set(range(max(0, first - ROWS_AROUND), first + ROWS_AROUND + 1)) | set(worst)
        header = (
            f"{'order':>5}  {'node':<28} {'op':<28} {'shape':<16} {'max abs':>10} {'max rel':>10}"
        )
        lines = [header]
        previous = -1
        for i, row in enumerate(rows):
            if i not in shown:
                continue
            if i != previous + 1:
                lines.append(f"{'...':>5}")
            previous = i
            mark = "" if row.ok else "  <- differs" + (f": {row.note}" if row.note else "")
            lines.append(
                f"{row.order:>5}  {row.name_a[:28]:<28} {row.op_b[:28]:<28} {row.shape[:16]:<16} "
                f"{row.max_abs:>10.3g} {row.max_rel:>10.3g}{mark}"
            )
        return lines


def describe(index: DumpIndex) -> str:
    return (
        f"{index.path} ({index.graph}, {index.stage}, {index.key}, call {index.call}, {index.how})"
    )


def compare_dumps(
    dump_a: str | os.PathLike[str] | DumpIndex,
    dump_b: str | os.PathLike[str] | DumpIndex,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> Comparison:
    """Align two dumps of one graph node by node and compare every tensor output."""
    a = dump_a if isinstance(dump_a, DumpIndex) else read_dump(dump_a)
    b = dump_b if isinstance(dump_b, DumpIndex) else read_dump(dump_b)
    if a.graph != b.graph:
        raise DumpError(
            f"the dumps are of different graphs ({a.graph} in {a.path}, {b.graph} in {b.path}); "
            "compare two dumps of one graph"
        )
    nodes_b = {origin_of(node): node for node in b.nodes}  # the last node of each origin
    nodes_a = {origin_of(node): node for node in a.nodes}
    common = [node for node in a.nodes if nodes_a[origin_of(node)] is node]
    common = [node for node in common if origin_of(node) in nodes_b]
    if not common:
        raise DumpError(
            f"{a.path} and {b.path} have no node in common; were they dumped from one graph?"
        )
    comparison = Comparison(a, b, rtol, atol)
    comparison.only_a = [n.name for n in a.nodes if origin_of(n) not in nodes_b]
    comparison.only_b = [n.name for n in b.nodes if origin_of(n) not in nodes_a]
    for node in common:
        row = compare_node(a, node, b, nodes_b[origin_of(node)], rtol, atol)
        if row is not None:
            comparison.rows.append(row)
    return comparison


def origin_of(node: DumpedNode) -> str:
    return node.origin or node.name


def compare_node(
    a: DumpIndex, node_a: DumpedNode, b: DumpIndex, node_b: DumpedNode, rtol: float, atol: float
) -> Row | None:
    """The row of two aligned nodes, or None when they have no tensor output in common or one of
    them only allocates (its values are whatever the memory held)."""
    if uninitialised(node_a.op) or uninitialised(node_b.op):
        return None
    pairs = [
        (out_a, out_b)
        for out_a, out_b in zip(node_a.outputs, node_b.outputs, strict=False)
        if out_a.file is not None and out_b.file is not None
    ]
    if not pairs:
        return None
    worst_abs = worst_rel = 0.0
    ok, notes, shapes = True, [], []
    for out_a, out_b in pairs:
        tensor_a, tensor_b = a.tensor(out_a), b.tensor(out_b)
        shapes.append("x".join(map(str, tensor_a.shape)) or "scalar")
        if tensor_a.shape != tensor_b.shape or tensor_a.dtype != tensor_b.dtype:
            ok = False
            notes.append(
                f"{tuple(tensor_a.shape)} {tensor_a.dtype} against "
                f"{tuple(tensor_b.shape)} {tensor_b.dtype}"
            )
            worst_abs = worst_rel = float("inf")
            continue
        abs_error, rel_error, close, note = errors(tensor_a, tensor_b, rtol, atol)
        worst_abs, worst_rel = max(worst_abs, abs_error), max(worst_rel, rel_error)
        ok &= close
        if note:
            notes.append(note)
    return Row(
        order=node_a.order,
        origin=origin_of(node_a),
        name_a=node_a.name,
        name_b=node_b.name,
        op_b=node_b.op,
        source=node_b.source if node_b.source != "<unknown source>" else node_a.source,
        shape=",".join(shapes),
        max_abs=worst_abs,
        max_rel=worst_rel,
        ok=ok,
        note="; ".join(notes),
    )


def uninitialised(op: str) -> bool:
    return op.rsplit(".", 1)[0] in UNINITIALISED


def errors(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> tuple[Any, ...]:
    """Max absolute and relative error over the elements finite in both, whether ``a`` is close
    to ``b`` (``torch.isclose``, NaN equal to NaN), and a note where NaN or infinity differ."""
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    a64, b64 = a.double(), b.double()
    finite = a64.isfinite() & b64.isfinite()
    difference = (a64 - b64).abs()
    relative = difference / b64.abs().clamp_min(torch.finfo(torch.float64).tiny)
    abs_error = float(difference[finite].max()) if finite.any() else 0.0
    rel_error = float(relative[finite].max()) if finite.any() else 0.0
    close = bool(torch.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True).all())
    unequal = ~finite & ~((a64.isnan() & b64.isnan()) | (a64 == b64))
    if not unequal.any():
        return abs_error, rel_error, close, ""
    note = f"NaN or infinity in {int(unequal.sum())} elements where the other dump differs"
    return float("inf"), rel_error, close, note


def plot_errors(comparison: Comparison, path: str | os.PathLike[str]) -> Path:
    """A PNG of the max abs error per node along the graph, the first divergence marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise DumpError("--plot needs matplotlib: pip install matplotlib") from error
    rows = comparison.rows
    floor = 1e-20
    x = [row.order for row in rows]
    y = [max(min(row.max_abs, 1e300), floor) for row in rows]
    figure, axes = plt.subplots(figsize=(10, 4))
    axes.plot(x, y, marker=".", linewidth=1, label="max abs error")
    axes.axhline(comparison.atol, color="grey", linestyle=":", label=f"atol {comparison.atol:g}")
    first = comparison.first_divergence
    if first is not None:
        axes.axvline(
            first.order, color="red", linestyle="--", label=f"first divergence: {first.name_a}"
        )
    axes.set_yscale("log")
    axes.set_xlabel("node (graph order)")
    axes.set_ylabel("max abs error")
    axes.set_title(f"{comparison.a.graph}: {comparison.a.stage} against {comparison.b.stage}")
    axes.legend(loc="upper left")
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out
