"""Compiled kernels for the hot keys of one graph, made in a compile process while the ATen
replay serves (``static_kernel_compile="background"``), or for every key before its first replay
(``True``: the synchronous case, ``KernelTier.compile_now``).

A key replays its ATen kernels from its first call. Once it is hot (``background_compile_after``
replays) its graph is compiled by a compile process (``processes``): for the key's static sizes,
or, for a graph with symbolic sizes, once for all its keys (``symbolic``). Each compile is one
``Compile`` record that moves through one lifecycle:

    compiling --reply--> received --load (serving thread, call boundary)--> warming --> ready
        \\______________________\\________________________________________\\--> failed

``warming``: the kernels' first run, on copies of the requesting key's inputs, in a thread (the
compiled code leaves the interpreter lock while it runs); where a device's capture warms kernels
up itself, a load goes straight to ``ready``. Kernels an earlier process kept come from the
compile cache (``KernelStore``) as records already ``received``. The key's side (hot, trial,
swap, reasons) is ``capture/tiers``.

Nothing here runs Python beside the serving thread for long: the graph's bytes are made at its
first capture (which compiles and captures anyway), a request is one message, the exchange
thread only blocks on the pipe, and the load runs at a call boundary.
"""

from __future__ import annotations

import enum
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.fx

from npugraph_ex.capture.analysis import graph_draws_random_numbers
from npugraph_ex.errors import error_summary
from npugraph_ex.kernels.cores import background_cores, pin
from npugraph_ex.kernels.graph_bytes import pickle_graph
from npugraph_ex.kernels.loading import import_loading_modules, load_compiled
from npugraph_ex.kernels.messages import frame, message
from npugraph_ex.kernels.processes import PROCESSES
from npugraph_ex.kernels.remote_compile import input_specs
from npugraph_ex.kernels.static_compile import chosen, input_signature, lower, positional
from npugraph_ex.kernels.symbolic import SymbolicSpec
from npugraph_ex.runtime import runtime_for
from npugraph_ex.runtime.platform import platform_for


@dataclass
class StoredKernels:
    """Kernels a key kept, as the compile cache stores them."""

    signature: tuple | None
    """The input layouts they were compiled for; None for a graph's symbolic compile."""
    data: bytes
    guards: str | None
    facts: dict[Any, Any] = field(default_factory=dict)
    """What their load needs to know of the host (``DeviceRuntime.loading_facts``)."""


class KernelStore(Protocol):
    """Where kept kernels go and a later process finds them (``cache_compile``'s folder)."""

    def load(self, graph_id: str) -> list[StoredKernels]: ...

    def save(self, graph_id: str, kernels: StoredKernels) -> None: ...


def graph_id(gm: torch.fx.GraphModule, device_type: str, symbolic: Any) -> str:
    """What names a graph's kernels in a store: a digest of its code, device and symbolic
    sizes, the same for the graph a process compiled and the one a later process loaded."""
    text = "\n".join([gm.code, device_type, repr(symbolic)])
    return hashlib.sha256(text.encode()).hexdigest()


class CompileState(enum.Enum):
    COMPILING = "compiling"
    RECEIVED = "received"
    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"


@dataclass(eq=False)
class Compile:
    """One compile of a graph's kernels (see the module docstring)."""

    signature: tuple | None
    """The input layouts it is for; None: the graph's symbolic compile, shared by its keys."""
    warm_args: list[Any] | None = None
    """Copies of the requesting key's inputs the kernels first run on (None: no warm run)."""
    stored: bool = False
    """Kept by an earlier process (from the compile cache): they need no trial."""
    state: CompileState = CompileState.COMPILING
    started: float = field(default_factory=time.monotonic)
    data: bytes = b""
    guards: str | None = None
    """For a symbolic compile: what a key's inputs must satisfy to call it (``symbolic``)."""
    facts: dict[Any, Any] = field(default_factory=dict)
    run: Callable[..., Any] | None = None
    """Once loaded: called like the FX graph (positional inputs)."""
    error: str = ""
    saved: bool = False
    in_flight: bool = False
    """Counted in ``PROCESSES.in_flight`` while it compiles and while it first runs: while it
    uses the background cores."""

    @property
    def symbolic(self) -> bool:
        return self.signature is None

    def received(self, reply: Any) -> None:
        """On the exchange thread: the compile process's reply (None: it died)."""
        if reply is None:
            self.fail("the compile worker process exited")
        elif not reply[0]:
            self.fail(reply[1])
        else:
            self.data, self.guards, self.facts = reply[1]
            # Out of flight while it waits for a call of its key: a key never called again
            # must not hold the compile slots (its first run comes back into flight).
            self.leave_flight()
            self.state = CompileState.RECEIVED  # last: the serving thread reads it unlocked

    def fail(self, error: str) -> None:
        self.error = error
        self.warm_args = None
        self.state = CompileState.FAILED
        self.leave_flight()

    def ready(self) -> None:
        self.warm_args = None
        self.state = CompileState.READY
        self.leave_flight()

    def leave_flight(self) -> None:
        if self.in_flight:
            self.in_flight = False
            PROCESSES.finished()


class KernelTier:
    """The compiles of one graph's keys (see the module docstring); with ``synchronous``
    (``static_kernel_compile=True``), each key's compile made in this process before its first
    replay, the kernels serving unchecked (``compile_now``).

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
        synchronous: bool = False,
    ):
        self.gm = gm
        self.device_type = device_type
        self.use_cache = not config.disable_static_kernel_compile_cache
        self.after = config.background_compile_after
        self.limit = config.background_compiles_in_flight
        self.min_gain = config.background_min_gain
        self.cores = config.background_cores
        self.seconds = config.background_compile_seconds
        self.chooses = config.static_kernels_for
        self.empty = not any(node.op.startswith("call") for node in gm.graph.nodes)
        """No op to compile (``remote_compile.NOTHING_TO_COMPILE``)."""
        self.draws_random = graph_draws_random_numbers(gm.graph)
        """Its random ops draw from the process's generator: a first run in a thread beside
        the serving one would take numbers from between the calls', so none is made."""
        self.threads = torch.get_num_threads()
        """The intra-op threads of calls, read here: a replay during a compile runs with fewer
        (``kernels/cores``)."""
        self.synchronize = synchronize
        """Waits for the device's queued work (a timed call ends when its kernels do)."""
        self.symbolic = symbolic
        """The placeholders' symbolic sizes (``symbolic_specs``), for one compile serving
        every key; None for a static graph, or once its symbolic compile failed."""
        self.store = store
        self.id = graph_id(gm, device_type, symbolic) if store is not None else ""
        self.graph: bytes | None = None
        """The graph in the cache's format, framed for a compile process (``messages``), made at
        its first capture (``prepare``)."""
        self.unsendable = ""
        """Why the graph could not be made into bytes, if it could not."""
        self.compiles: dict[tuple | None, Compile] = {}
        """Every compile of this graph, by input layouts (None: the symbolic one)."""
        self.replays = 0
        """Replays of this graph's keys on their ATen graphs, together."""
        self.sent = 0
        """Compiles sent to a compile process for this graph."""
        self.synchronous = synchronous

    def compile_now(self, args: Sequence[Any]) -> tuple[Compile, str]:
        """In this process, before a key's first replay: its kernels, ready, and how they were
        made: ``"compiled"``, ``"cache_hit"`` (Inductor's cache on disk had them) or
        ``"reused"`` (this graph made them for inputs like these; a recapture)."""
        from torch._dynamo.utils import counters

        signature = input_signature(args)
        known = self.compiles.get(signature)
        if known is not None and known.state is CompileState.READY:
            return known, "reused"
        hits_before = counters["inductor"]["fxgraph_cache_hit"]
        made = Compile(signature)
        made.run = positional(lower(self.gm, args, self.device_type, self.use_cache))
        made.ready()
        self.compiles[signature] = made
        loaded = counters["inductor"]["fxgraph_cache_hit"] > hits_before
        return made, "cache_hit" if loaded else "compiled"

    def prepare(self) -> None:
        """At the first capture of a key (a call that compiles and captures anyway): the graph's
        bytes for its compiles, and the kernels an earlier process kept."""
        if self.graph is not None or self.unsendable:
            return
        import_loading_modules()
        try:
            self.graph = frame(pickle_graph(self.gm))
        except Exception as error:  # its keys keep ATen, and say why (``request``)
            self.unsendable = f"the graph cannot be sent: {type(error).__name__}: {error}"[:500]
        if self.store is not None:
            for entry in self.store.load(self.id):
                stored = Compile(entry.signature, stored=True, saved=True)
                stored.data, stored.guards = entry.data, entry.guards
                stored.facts = getattr(entry, "facts", {})  # absent from older files
                stored.state = CompileState.RECEIVED
                self.compiles[entry.signature] = stored

    def wants(self, args: Sequence[Any]) -> bool:
        return chosen(self.chooses, args)

    def shares(self, own: bool) -> bool:
        """Whether a key (asking for kernels of its ``own`` sizes, or not) takes the graph's
        symbolic compile."""
        return not own and self.symbolic is not None

    def compile_for(self, args: Sequence[Any], own: bool) -> Compile | None:
        """The compile that would serve a key with inputs ``args``, made or stored, if any."""
        return self.compiles.get(None if self.shares(own) else input_signature(args))

    def hot(self, key_replays: int, own: bool) -> bool:
        """Whether a key replayed ``key_replays`` times asks for kernels now: a compile of its
        own (``own``) or of a static graph once it is hot itself, the shared one once the graph
        is (or at once, where it is asked for already)."""
        if not self.shares(own):
            return key_replays >= self.after
        return None in self.compiles or self.replays >= self.after

    def request(self, args: Sequence[Any], kept: Sequence[int], own: bool) -> Compile | None:
        """The compile serving a key with inputs ``args`` (this call's values, just staged):
        made, stored, or sent now; None while ``background_compiles_in_flight`` others are in
        flight. Where a capture of kernels is their first run (CPU), the kernels first run on
        copies of every input but those at ``kept`` (parameters and buffers, which the graph
        never writes), in a thread: the call that swaps them in then pays no first-run costs
        (oneDNN's primitives, say), and the staged buffers, which later calls rewrite, are not
        read later."""
        known = self.compile_for(args, own)
        if known is not None:  # a failed one too: the key learns of the failure from it
            return known
        shared = self.shares(own)
        signature = None if shared else input_signature(args)
        warms = not runtime_for(self.device_type).warms_up("kernels") and not self.draws_random
        warm_args = None
        if warms:
            warm_args = [
                a if i in kept or not isinstance(a, torch.Tensor) else a.clone()
                for i, a in enumerate(args)
            ]
        made = Compile(signature, warm_args)
        if self.unsendable:
            made.fail(self.unsendable)
            self.compiles[signature] = made
            return made
        symbolic = self.symbolic if shared else None
        specs = input_specs(args)

        def request() -> tuple[bytes, bytes]:
            answers = platform_for(self.device_type).measured_answers()
            arguments = (specs, self.device_type, self.use_cache, symbolic, self.threads, answers)
            return self.graph, message(arguments)

        made.in_flight = True  # before the reply can come: a quick failure leaves flight
        if not PROCESSES.submit(self.limit, request, made.received, self.cores, self.seconds):
            made.in_flight = False
            return None
        self.sent += 1
        self.compiles[signature] = made
        return made

    def load(self, made: Compile) -> None:
        """At a call boundary, in the serving thread: load a received compile, then run it
        once on its copies in a thread (``warming``), or mark it ready."""
        try:
            made.run = load_compiled(made.data, self.device_type, made.facts)
        except Exception as error:  # a result this process cannot load
            made.fail(error_summary(error, 500))
            return
        if made.warm_args is None:
            made.ready()
            return
        made.state = CompileState.WARMING
        made.in_flight = True  # its first run takes the background cores
        PROCESSES.entered()
        # Not a daemon: the run is compiled code that takes the interpreter lock back when it
        # ends, and a daemon thread doing that while the interpreter finalizes aborts the
        # process; the process's end waits for the run instead.
        threading.Thread(target=self.warm, args=(made,), name="npugraph_ex-warm").start()

    def warm(self, made: Compile) -> None:
        """In a thread on the background cores: the kernels' first run on their copies (lazily
        made state, made here, not in a call)."""
        pin(0, background_cores(self.cores))
        try:
            with torch.no_grad():
                made.run(*made.warm_args)
        except Exception as error:  # the swap's capture would fail the same way
            made.fail(error_summary(error, 500))
            return
        made.ready()

    def forget(self, made: Compile) -> None:
        """A stored compile that failed to load: the graph's keys compile as if there were
        none."""
        if self.compiles.get(made.signature) is made:
            del self.compiles[made.signature]

    def drop_symbolic(self) -> None:
        """The symbolic compile failed: the graph's keys compile one by one from now on."""
        self.symbolic = None

    def keep(self, made: Compile, args: Sequence[Any]) -> None:
        """Store kernels a key kept (in a thread: the write syncs to disk), once."""
        if self.store is None or made.saved:
            return
        made.saved = True
        entry = StoredKernels(made.signature, made.data, made.guards, made.facts)
        # Not a daemon: a process that ends right after the decision still finishes the write.
        threading.Thread(
            target=self.store.save, args=(self.id, entry), name="npugraph_ex-store"
        ).start()
