"""``CachedMethod``: a module's method compiled once per cache, replayed in later processes.

A call looks for a stored variant whose argument state matches (the arguments' types, values
and tensor kinds, and the global modes) and runs its bytecode; the stored graph then checks its
shape guards. A call no stored variant fits goes to ``torch.compile`` (``fullgraph=True``, the
recording backend); each frame Dynamo compiles for it is stored as a new variant, merged into
the entry on disk, and this process's later calls take that variant's path as well (on the graph
it compiled), so that a cold process runs as a warm one does from its second call on.

Nothing a cache problem causes stops the method: a stale or corrupt file is reported once and
rebuilt, an unwritable cache directory is reported once and the method runs uncached, a method
that cannot be stored (a graph break) runs under plain ``torch.compile``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.cache.cached_graph import CachedGraph, Misfit
from npugraph_ex.cache.entry import EntryKey, VariantRecord, entry_key, load_variants, save_variant
from npugraph_ex.cache.files import CacheFileError
from npugraph_ex.cache.fingerprint import describe, file_digest, global_state
from npugraph_ex.cache.frame import FrameError, bind_frame, record_frame
from npugraph_ex.cache.graph_record import GraphRecorder
from npugraph_ex.cache.kernel_files import KernelFiles
from npugraph_ex.compat import dynamo_cache_entries
from npugraph_ex.config import Config
from npugraph_ex.debug.once import log_once
from npugraph_ex.dynamo_backend import npugraph_ex_backend

log = logging.getLogger(__name__)


class RecordingBackend:
    """The npugraph_ex backend, keeping a :class:`GraphRecorder` per graph it compiles."""

    def __init__(self, options: dict[str, Any]):
        self.options = options
        self.recorders: list[GraphRecorder] = []
        self.kernel_store: KernelFiles | None = None
        """Set once the method's entry is known (``CachedMethod.load``)."""

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        recorder = GraphRecorder(gm)
        compiled = npugraph_ex_backend(
            gm,
            example_inputs,
            options=self.options,
            on_lowered=recorder.lowered,
            kernel_store=self.kernel_store,
        )
        self.recorders.append(recorder)
        return compiled


class Variant:
    """A stored variant, bound to the method of this process on first use; ``calls``, for a
    variant this process compiled and stored, are the callables its compile built."""

    def __init__(
        self,
        record: VariantRecord,
        config: Config,
        calls: list[Any] | None = None,
        kernel_store: KernelFiles | None = None,
    ):
        self.frame = record.frame
        calls = calls or [None] * len(record.graphs)
        self.graphs = [
            CachedGraph(graph, config, call, kernel_store)
            for graph, call in zip(record.graphs, calls, strict=True)
        ]
        self.function: Any = None

    def __call__(self, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.function is None:
            self.function = bind_frame(self.frame, method.__func__, self.graphs)
        return self.function(method.__self__, *args, **kwargs)


class CachedMethod:
    """What ``npugraph_ex.inference.cache_compile`` returns; call it like the method."""

    def __init__(
        self,
        method: Any,
        *,
        options: dict[str, Any],
        dynamic: bool,
        cache_dir: Path,
        ranks: dict[str, int],
    ):
        self.method = method
        self.options = options
        self.config = Config.from_options(options)
        self.dynamic = dynamic
        self.cache_dir = cache_dir
        self.ranks = ranks
        self.recording = RecordingBackend(options)
        self.compiled = torch.compile(
            method, backend=self.recording, dynamic=dynamic, fullgraph=True
        )
        self.key: EntryKey | None = None
        self.variants: dict[Any, list[Variant]] | None = None
        self.loaded = 0
        """How many variants came from the file (a call none of them fits is worth a warning)."""
        self.uncached: str | None = None
        self.counts: Counter = Counter()
        self.load_seconds = 0.0
        if self.config.mode == "max-autotune":
            self.run_uncached("mode='max-autotune' compiles whole graphs with Inductor")

    @property
    def path(self) -> Path | None:
        """The cache file of this method (known after the first call)."""
        return self.key.path if self.key is not None else None

    def cache_info(self) -> dict[str, Any]:
        """Counts of this method's calls by how they ran, where its cache file is, and the
        seconds spent reading and checking that file (``load_seconds``) and unpickling its
        graphs and making their capture managers, each at its first call (``build_seconds``)."""
        variants = [v for same_state in (self.variants or {}).values() for v in same_state]
        return {
            "path": str(self.path) if self.path else None,
            "variants": len(variants),
            "load_seconds": self.load_seconds,
            "build_seconds": sum(g.build_seconds for v in variants for g in v.graphs),
            "uncached": self.uncached,
            **{name: self.counts[name] for name in ("hits", "compiled", "misfits", "saved")},
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.variants is None:
            self.load()
        state = (global_state(), describe(args), describe(kwargs))
        reason = "its arguments' types, ranks, dtypes or values differ from every cached variant's"
        for variant in self.variants.get(state, ()):  # type: ignore[union-attr]
            try:
                result = variant(self.method, args, kwargs)
            except Misfit as misfit:
                self.counts["misfits"] += 1
                reason = str(misfit)
                continue
            self.counts["hits"] += 1
            return result
        if self.loaded:
            self.warn(
                "misfit",
                "a call does not fit the cached graphs (%s); compiling it and adding it to %s",
                reason,
                self.path,
            )
        return self.compile_call(state, args, kwargs)

    def load(self) -> None:
        started = time.perf_counter()
        self.variants = {}
        if self.uncached is not None:
            return
        self.key = entry_key(
            self.method,
            self.config,
            dynamic=self.dynamic,
            cache_dir=self.cache_dir,
            ranks=self.ranks,
        )
        try:
            records = load_variants(self.key)
        except FileNotFoundError:
            records = []
        except CacheFileError as error:
            self.warn("bad file", "%s; it is rebuilt", error)
            records = []
        self.recording.kernel_store = self.kernel_store()
        for record in records:
            variant = Variant(record, self.config, kernel_store=self.recording.kernel_store)
            self.variants.setdefault(record.state, []).append(variant)
        self.loaded = len(records)
        self.load_seconds = time.perf_counter() - started

    def kernel_store(self) -> KernelFiles | None:
        """Where background kernels go beside the entry (``kernel_files``), where there are
        any."""
        if self.config.static_kernel_compile not in ("background", None) or self.key is None:
            return None
        return KernelFiles(self.key.path.parent / "kernels")

    def compile_call(self, state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        before = len(self.recording.recorders)
        try:
            result = self.compiled(*args, **kwargs)
        except torch._dynamo.exc.Unsupported as error:
            if self.uncached is not None:
                raise
            self.run_uncached(f"the method has a graph break ({str(error).splitlines()[0]})")
            return self.compiled(*args, **kwargs)
        new = self.recording.recorders[before:]
        if new:
            self.counts["compiled"] += 1
            self.store(state, new)
        return result

    def store(self, state: Any, recorders: list[GraphRecorder]) -> None:
        try:
            variant = self.variant_record(state, recorders)
            count = save_variant(self.key, self.method, variant)  # type: ignore[arg-type]
        except (FrameError, CacheFileError) as error:
            self.warn(("not stored", str(error)), "this variant is not cached: %s", error)
            return
        except OSError as error:
            self.warn("unwritable", "cannot write the cache (%s); the method runs uncached", error)
            return
        self.counts["saved"] += 1
        log.info("npugraph_ex: cache_compile: %s now holds %d variant(s)", self.path, count)
        # Later calls of this process take the stored variant's path too, on the graph this
        # compile built: the same checks as in a warm process, not Dynamo's guards again.
        live = Variant(variant, self.config, calls=[r.call for r in recorders])
        self.variants.setdefault(state, []).append(live)  # type: ignore[union-attr]

    def variant_record(self, state: Any, recorders: list[GraphRecorder]) -> VariantRecord:
        if len(recorders) != 1:
            raise FrameError(f"one call compiled {len(recorders)} graphs")
        recorder = recorders[0]
        graph = recorder.finish()
        if graph is None:
            raise FrameError(recorder.reason or "the graph was not recorded")
        entries = dynamo_cache_entries(self.method.__func__.__code__)
        if not entries:
            raise FrameError("Dynamo kept no compiled frame for the method")
        frame, compiled_fns = record_frame(entries[0].code, self.method.__func__.__globals__)
        if len(compiled_fns) != 1:
            raise FrameError(f"the frame calls {len(compiled_fns)} graphs")
        files = {path: file_digest(path) for path in recorder.traced_files}
        summary = (
            f"{graph.name}: {len(graph.inputs)} inputs, {graph.nodes} nodes, "
            f"{len(graph.guards)} shape guards"
        )
        return VariantRecord(state, frame, [graph], files, summary)

    def run_uncached(self, reason: str) -> None:
        self.uncached = reason
        self.warn(("uncached", reason), "%s; it runs compiled, without the cache", reason)
        self.compiled = torch.compile(
            self.method, backend=npugraph_ex_backend, dynamic=self.dynamic, options=self.options
        )

    def warn(self, key: Any, message: str, *args: Any) -> None:
        name = f"{type(self.method.__self__).__name__}.{self.method.__func__.__name__}"
        log_once(
            log,
            logging.WARNING,
            ("cache_compile", id(self), key),
            f"npugraph_ex: cache_compile: {name}: {message}",
            *args,
        )
