"""A cache entry: the key of one cached method and the variants compiled for it, on disk.

One file per method, model class, options and ranks, laid out as TorchAir lays out its cache:

    <cache_dir>/<ModelClass>_<dynamic|static>_<key[:16]>/[<ranks>/]<method>/compiled_module

The directory name carries a prefix of the key; the header carries all of it, with each source
file Dynamo traced and its digest. A file whose key, versions or sources differ is stale: it is
reported once and rebuilt, never loaded.
"""

from __future__ import annotations

import datetime
import inspect
import pickle
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.cache.files import FORMAT, CacheFileError, entry_lock, read_entry, write_entry
from npugraph_ex.cache.fingerprint import (
    code_digest,
    digest,
    file_digest,
    module_structure,
    package_digest,
    qualified_name,
)
from npugraph_ex.cache.frame import FrameRecord
from npugraph_ex.cache.graph_record import GraphRecord
from npugraph_ex.config import Config

FILE_NAME = "compiled_module"


@dataclass
class VariantRecord:
    """One compiled frame of the method: for calls whose ``state`` matches, its bytecode and
    graphs (their shape guards decide the rest)."""

    state: Any
    frame: FrameRecord
    graphs: list[GraphRecord]
    traced_files: dict[str, str | None] = field(default_factory=dict)
    summary: str = ""


@dataclass(frozen=True)
class EntryKey:
    digest: str
    parts: dict[str, str]
    path: Path


def entry_key(
    method: Any, config: Config, *, dynamic: bool, cache_dir: Path, ranks: dict[str, int]
) -> EntryKey:
    """Everything a stored graph depends on that no guard checks per call."""
    from npugraph_ex import __version__

    module, function = method.__self__, method.__func__
    passes = [
        inspect.unwrap(fn)  # the user's function, where the backend wrapped it
        for fn in (config.post_grad_custom_pre_pass, config.post_grad_custom_post_pass)
    ]
    code = [code_digest(fn) for fn in passes]
    # Decompositions change the traced graph: each op and its function's code join the key.
    decompositions = sorted((config.custom_decompositions or {}).items(), key=lambda i: str(i[0]))
    code += [f"{op} {code_digest(fn)}" for op, fn in decompositions]
    parts = {
        "format": str(FORMAT),
        "npugraph_ex": f"{__version__} {package_digest()}",
        "torch": f"{torch.__version__} {torch.version.git_version}",
        "python": sys.version,
        "machine": platform.machine(),
        "method": f"{function.__qualname__} {code_digest(function)}",
        "module": f"{qualified_name(type(module))} {module_structure(module)}",
        "options": f"{config.compute_hash()} {code}",
        "dynamic": str(dynamic),
        "ranks": repr(sorted(ranks.items())),
    }
    key = digest(sorted(parts.items()))
    rank_dir = "_".join(f"{name}{value}" for name, value in sorted(ranks.items()))
    folder = cache_dir / f"{type(module).__name__}_{'dynamic' if dynamic else 'static'}_{key[:16]}"
    if rank_dir:
        folder = folder / rank_dir
    return EntryKey(key, parts, folder / function.__name__ / FILE_NAME)


def load_variants(key: EntryKey) -> list[VariantRecord]:
    """The variants stored under ``key``; raises ``CacheFileError`` for a stale or bad file
    and ``FileNotFoundError`` when there is none."""
    header, payload = read_entry(key.path)
    if header.get("key") != key.digest:
        changed = sorted(
            name for name, value in key.parts.items() if header.get("parts", {}).get(name) != value
        )
        raise CacheFileError(f"{key.path}: stale: built for another {', '.join(changed) or 'key'}")
    try:
        variants = pickle.loads(payload)  # noqa: S301 - a private file of this user, checked
    except Exception as error:
        raise CacheFileError(f"{key.path}: unreadable payload ({error})") from None
    digests: dict[str, str | None] = {}  # variants share most of their traced files
    for variant in variants:
        for path, expected in variant.traced_files.items():
            if path not in digests:
                digests[path] = file_digest(path)
            if digests[path] != expected:
                raise CacheFileError(f"{key.path}: stale: {path} changed since it was traced")
    return variants


def save_variant(key: EntryKey, method: Any, variant: VariantRecord) -> int:
    """Add ``variant`` to the stored entry, merging with what another process may have written;
    return how many variants the entry now holds."""
    with entry_lock(key.path):
        try:
            variants = load_variants(key)
        except (FileNotFoundError, CacheFileError):
            variants = []
        variants = [v for v in variants if not same_variant(v, variant)] + [variant]
        header = {
            "key": key.digest,
            "parts": key.parts,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "method": f"{qualified_name(type(method.__self__))}.{method.__func__.__name__}",
            "variants": [v.summary for v in variants],
        }
        write_entry(key.path, header, pickle.dumps(variants))
    return len(variants)


def same_variant(a: VariantRecord, b: VariantRecord) -> bool:
    return a.state == b.state and [g.guards for g in a.graphs] == [g.guards for g in b.graphs]
