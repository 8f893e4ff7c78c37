"""Compiled kernels for hot keys, made in a worker process while the ATen replay serves.

``static_kernel_compile="background"``: a key replays its ATen kernels from its first call.
Once it is hot (``background_compile_after`` replays), its graph is compiled by a worker process
(``workers``): for the key's static sizes, exactly as ``static_kernel_compile=True`` does in the
serving process, or, for a graph with symbolic sizes, once for all its keys (``symbolic``). The
key swaps the kernels in at a call boundary (``capture/tiers``). With the compile cache, kernels a
key kept are stored (``KernelStore``), and a later process starts on them.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.fx

from npugraph_ex.kernels.graph_bytes import pickle_graph
from npugraph_ex.kernels.static_compile import chosen, input_signature
from npugraph_ex.kernels.symbolic import SymbolicSpec
from npugraph_ex.kernels.workers import (
    LOADING,
    WORKERS,
    Job,
    MadeKernels,
    input_specs,
    load_compiled,
)
from npugraph_ex.runtime.platform import platform_for


@dataclass
class StoredKernels:
    """Kernels a key kept, as the compile cache stores them."""

    signature: tuple | None
    """The input layouts they were compiled for; None for a graph's symbolic compile."""
    data: bytes
    guards: str | None


class KernelStore(Protocol):
    """Where kept kernels go and a later process finds them (``cache_compile``'s folder)."""

    def load(self, graph_id: str) -> list[StoredKernels]: ...

    def save(self, graph_id: str, kernels: StoredKernels) -> None: ...


def graph_id(gm: torch.fx.GraphModule, device_type: str, symbolic: Any) -> str:
    """What names a graph's kernels in a store: a digest of its code, device and symbolic
    sizes, the same for the graph a process compiled and the one a later process loaded."""
    text = "\n".join([gm.code, device_type, repr(symbolic)])
    return hashlib.sha256(text.encode()).hexdigest()


class BackgroundKernels:
    """The background compiles of one graph's keys (see the module docstring).

    A graph with symbolic sizes (``symbolic``) is hot once its keys together have replayed
    ``background_compile_after`` times, and gets one compile that every key passing its guards
    shares; a key failing them, or every key of a graph whose symbolic compile failed, gets a
    compile for its own sizes once it is hot by itself. A static graph's keys get their own."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        device_type: str,
        config: Any,
        synchronize: Callable[[], None],
        symbolic: list[SymbolicSpec] | None = None,
        store: KernelStore | None = None,
    ):
        self.gm = gm
        self.device_type = device_type
        self.use_cache = not config.disable_static_kernel_compile_cache
        self.after = config.background_compile_after
        self.limit = config.background_compiles_in_flight
        self.min_gain = config.background_min_gain
        self.cores = config.background_cores
        self.threads = torch.get_num_threads()
        """The intra-op threads of calls, read here: a replay during a compile runs with fewer
        (``kernels/cores``)."""
        LOADING.prepare(device_type, self.cores)
        self.chooses = config.static_kernels_for
        self.synchronize = synchronize
        """Waits for the device's queued work (a timed call ends when its kernels do)."""
        self.graph: bytes | None = None
        """The graph in the cache's format, made at the first request."""
        self.pickling = threading.Lock()
        self.symbolic = symbolic
        """The placeholders' symbolic sizes (``symbolic_specs``), for one compile serving
        every key; None for a static graph, or once its symbolic compile failed."""
        self.shared: Future | None = None
        """The symbolic compile, once requested."""
        self.failed_shared: Future | None = None
        self.replays = 0
        """Replays of this graph's keys on their ATen graphs, together."""
        self.made: dict[tuple, Future] = {}
        """Compiles by input layouts: a key captured again (an input moved) reuses its own."""
        self.compiles = 0
        """Compiles sent to a worker for this graph."""
        self.store = store
        self.id = graph_id(gm, device_type, symbolic) if store is not None else ""
        self.saved: set[tuple | None] = set()
        self.forgotten: set[Future] = set()
        self.stored: dict[tuple | None, Future] = {}
        """Kernels an earlier process kept (by input layouts; None: the symbolic compile),
        loading in a thread from the store."""
        if store is not None:
            self.load_stored(store.load(self.id))

    def load_stored(self, entries: list[StoredKernels]) -> None:
        if not entries:
            return
        futures = [(entry, Future()) for entry in entries]
        for entry, future in futures:
            self.stored[entry.signature] = future

        def load() -> None:
            for entry, future in futures:
                try:
                    run = load_compiled(entry.data)
                except Exception as error:  # compiled again, as if it was never stored
                    future.set_exception(error)
                    continue
                symbolic = entry.signature is None
                future.set_result(MadeKernels(run, entry.guards, symbolic, entry.data, True))

        threading.Thread(target=load, name="npugraph_ex-stored-kernels", daemon=True).start()

    def stored_for(self, args: Sequence[Any], own: bool = False) -> Future | None:
        """Kernels an earlier process kept for a key with inputs ``args`` (made for its sizes,
        where ``own``), loading or loaded, or None."""
        if not self.stored:
            return None
        if not own and self.symbolic is not None and None in self.stored:
            return self.stored[None]
        return self.stored.get(input_signature(args))

    def forget(self, future: Future) -> bool:
        """Whether ``future`` was stored kernels (which failed to load): if so, the graph's keys
        compile as if there were none."""
        if future not in self.stored.values() and future not in self.forgotten:
            return False
        self.stored = {k: f for k, f in self.stored.items() if f is not future}
        self.forgotten.add(future)
        return True

    def keep(self, made: MadeKernels, args: Sequence[Any]) -> None:
        """Store kernels a key kept (in a thread: the write syncs to disk), once."""
        if self.store is None or made.stored:
            return
        signature = None if made.symbolic else input_signature(args)
        if signature in self.saved:
            return
        self.saved.add(signature)
        entry = StoredKernels(signature, made.data, made.guards)
        # Not a daemon: a process that ends right after the decision still finishes the write.
        threading.Thread(
            target=self.store.save, args=(self.id, entry), name="npugraph_ex-store"
        ).start()

    def hot(self, key_replays: int, own: bool) -> bool:
        """Whether a key replayed ``key_replays`` times asks for kernels now: a compile of its
        own (``own``) or of a static graph once it is hot itself, the shared one once the graph
        is (or at once, where it is asked for already)."""
        if own or self.symbolic is None:
            return key_replays >= self.after
        return self.shared is not None or self.replays >= self.after

    def request(
        self, args: Sequence[Any], kept: Sequence[int] = (), own: bool = False
    ) -> Future | None:
        """Start compiling kernels for inputs like ``args`` (this call's values: they were just
        staged), or for every key of the graph (``symbolic``) unless ``own``: a future of
        ``MadeKernels``; None while the workers are busy. Where their capture is their first run
        (CPU), the loading thread runs them once first, on copies of every input but those at
        ``kept`` (parameters and buffers, which the graph never writes): the call that swaps
        them in then pays no first-run costs (oneDNN's primitives, say), and the staged buffers,
        which other keys' replays reuse, are not read later."""
        if not own and self.symbolic is not None:
            if self.shared is None:
                self.shared = self.submit(args, kept, self.symbolic)
            return self.shared
        signature = input_signature(args)
        made = self.made.get(signature)
        if made is not None and not (made.done() and made.exception() is not None):
            return made
        future = self.submit(args, kept, None)
        if future is not None:
            self.made[signature] = future
        return future

    def submit(
        self, args: Sequence[Any], kept: Sequence[int], symbolic: list[SymbolicSpec] | None
    ) -> Future | None:
        future = WORKERS.submit(self.limit, lambda: self.job(args, kept, symbolic), self.cores)
        if future is not None:
            self.compiles += 1
        return future

    def failed(self, future: Future) -> bool:
        """Whether a key whose compile ``future`` failed may ask for one of its own: the shared
        compile failed, and the graph's keys compile one by one from now on."""
        if future is self.shared:
            self.symbolic, self.shared, self.failed_shared = None, None, future
        return future is self.failed_shared

    def job(
        self, args: Sequence[Any], kept: Sequence[int], symbolic: list[SymbolicSpec] | None
    ) -> Job:
        """What makes the request for a worker, and the copies of ``args`` the kernels first run
        on (made now: the staged buffers are other keys' too)."""
        specs = input_specs(args)

        def request() -> tuple[Any, ...]:
            return (self.graph_bytes(), specs, self.device_type, self.use_cache, symbolic,
                    self.threads)  # fmt: skip

        if platform_for(self.device_type).warms_up("kernels"):
            return request, symbolic is not None, None
        warm_args = [
            a if i in kept or not isinstance(a, torch.Tensor) else a.clone()
            for i, a in enumerate(args)
        ]
        return request, symbolic is not None, warm_args

    def graph_bytes(self) -> bytes:
        """The graph in the cache's format, made once (on a worker's thread)."""
        with self.pickling:
            if self.graph is None:
                self.graph = pickle_graph(self.gm)
            return self.graph

    def wants(self, args: Sequence[Any]) -> bool:
        return chosen(self.chooses, args)
