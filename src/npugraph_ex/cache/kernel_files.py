"""Background kernels in the compile cache: a warm process starts on the kernels an earlier
one compiled and kept, instead of compiling them again.

Beside a method's entry, one checked file (``files``) per compile a key kept:

    <entry folder>/kernels/<graph id[:16]>-shared.kernels        the symbolic compile of a graph
    <entry folder>/kernels/<graph id[:16]>-<layout[:16]>.kernels  a compile for one key's sizes

The graph id is a digest of the graph's code (``kernels.tier.graph_id``); the entry's key
already holds the versions, options and sources the graph came from. A file that cannot be read
(corrupt, not private, another format) is reported once and the graph compiles again; one whose
kernels fail to load does the same (``tiers``).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from pathlib import Path

from npugraph_ex.cache.files import CacheFileError, read_entry, write_entry
from npugraph_ex.debug.once import log_once
from npugraph_ex.kernels.tier import StoredKernels

log = logging.getLogger(__name__)

SUFFIX = ".kernels"


class KernelFiles:
    """The stored kernels of one cached method (``kernels.tier.KernelStore``)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def load(self, graph_id: str) -> list[StoredKernels]:
        stored = []
        for path in sorted(self.folder.glob(f"{graph_id[:16]}-*{SUFFIX}")):
            try:
                header, payload = read_entry(path)
                if header.get("graph") != graph_id:
                    continue
                stored.append(pickle.loads(payload))  # noqa: S301 - a private file, checked
            except (CacheFileError, OSError, pickle.UnpicklingError, EOFError) as error:
                log_once(
                    log,
                    logging.WARNING,
                    ("kernel file", str(path)),
                    "npugraph_ex: cache_compile: %s; its kernels are compiled again",
                    error,
                )
        return stored

    def save(self, graph_id: str, kernels: StoredKernels) -> None:
        if kernels.signature is None:
            name = "shared"
        else:
            name = hashlib.sha256(repr(kernels.signature).encode()).hexdigest()[:16]
        path = self.folder / f"{graph_id[:16]}-{name}{SUFFIX}"
        header = {"graph": graph_id, "guards": kernels.guards, "kernel_bytes": len(kernels.data)}
        try:
            write_entry(path, header, pickle.dumps(kernels))
        except OSError as error:
            log_once(
                log,
                logging.WARNING,
                ("kernel file unwritable", str(self.folder)),
                "npugraph_ex: cache_compile: cannot store background kernels in %s (%s)",
                self.folder,
                error,
            )
