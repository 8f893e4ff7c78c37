"""Cache entries as text: ``readable_cache`` and ``npugraph-ex cache list|show|clear``."""

from __future__ import annotations

import dis
import io
import marshal
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

from npugraph_ex.cache.entry import FILE_NAME
from npugraph_ex.cache.files import CacheFileError, read_entry, read_header
from npugraph_ex.errors import NpuGraphExError
from npugraph_ex.kernels.graph_bytes import load_graph

RULE = "=" * 100


@dataclass
class EntrySummary:
    path: Path
    method: str
    variants: int
    size: int
    created: str
    problem: str | None


def entry_files(path: Path) -> list[Path]:
    """The cache files at ``path``: the file itself, or every entry in the folder."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise NpuGraphExError(f"{path}: no such cache file or folder")
    return sorted(path.rglob(FILE_NAME))


def summarise(path: Path) -> EntrySummary:
    size = path.stat().st_size
    try:
        header, _ = read_header(path)
    except (CacheFileError, OSError) as error:
        return EntrySummary(path, "?", 0, size, "?", str(error))
    problem = None
    try:
        read_entry(path)
    except CacheFileError as error:
        problem = str(error)
    variants = header.get("variants", [])
    return EntrySummary(
        path, header.get("method", "?"), len(variants), size, header.get("created", "?"), problem
    )


def list_entries(folder: Path) -> str:
    rows = [summarise(path) for path in entry_files(folder)]
    if not rows:
        return f"no cache entries under {folder}"
    lines = [f"{len(rows)} cache entr{'y' if len(rows) == 1 else 'ies'} under {folder}"]
    for row in rows:
        status = "ok" if row.problem is None else f"UNUSABLE: {row.problem}"
        lines.append(f"- {row.path.relative_to(folder) if folder.is_dir() else row.path}")
        lines.append(
            f"  {row.method}, {row.variants} variant(s), {row.size / 1024:.0f} KiB, "
            f"created {row.created}, {status}"
        )
    return "\n".join(lines)


def clear_entries(folder: Path) -> list[Path]:
    """Remove every cache entry under ``folder`` (each entry's folder); return what went."""
    removed = []
    for path in entry_files(folder):
        entry_folder = path.parent
        shutil.rmtree(entry_folder)
        removed.append(entry_folder)
    return removed


def readable_entries(path: Path) -> str:
    return "\n".join(readable_entry(file) for file in entry_files(path))


def readable_entry(path: Path) -> str:
    lines = [RULE, f"cache file: {path}"]
    try:
        header, payload = read_entry(path)
        variants = pickle.loads(payload)  # noqa: S301 - a private file of this user, checked
    except (CacheFileError, pickle.UnpicklingError, EOFError) as error:
        return "\n".join([*lines, f"UNUSABLE: {error}"])
    lines.append(f"method: {header.get('method')}   created: {header.get('created')}")
    for name, value in sorted(header.get("parts", {}).items()):
        lines.append(f"  {name}: {value}")
    for number, variant in enumerate(variants):
        lines.append(title(f"variant {number}: {variant.summary}"))
        lines.append(f"argument state: {variant.state!r}"[:2000])
        for file, sha in sorted(variant.traced_files.items()):
            lines.append(f"traced source: {file} sha256={sha}")
        for graph in variant.graphs:
            lines.append(title(f"{graph.name}: shape guards"))
            lines.extend(graph.guards or ["(none)"])
            lines.append(title(f"{graph.name}: lowered graph"))
            lines.append(load_graph(graph.graph).code.strip())
        lines.append(title("caller bytecode"))
        stream = io.StringIO()
        dis.dis(marshal.loads(variant.frame.code), file=stream)
        lines.append(stream.getvalue().rstrip())
    return "\n".join(lines)


def title(text: str, width: int = 100) -> str:
    pad = max(0, width - len(text) - 2)
    return f"{'-' * (pad // 2)} {text} {'-' * (pad - pad // 2)}"
