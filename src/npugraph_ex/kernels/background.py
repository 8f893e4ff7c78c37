"""Compiled kernels for hot keys, made in a worker process while the ATen replay serves.

``static_kernel_compile="background"``: a key replays its ATen kernels from its first call.
Once it is hot (``background_compile_after`` replays), its graph is sent to a worker process in
the compile cache's format (``graph_bytes``: no fake values), with the key's input layouts; the
worker traces it with those static sizes and lowers it with Inductor, exactly as
``static_kernel_compile=True`` does in the serving process, and sends back Inductor's compiled
graph, serialised; a thread of the serving process loads it (about 2 ms, a second the first
time in a process), and the key swaps it in at a call boundary: the compile takes neither the
serving thread nor, but for the load, its GIL.

    serving thread:  replay  replay ... replay(8th) -> request  replay ...  ready? -> load, swap
    worker process:                                     trace, lower (seconds)  -> bytes

At most ``background_compiles_in_flight`` compiles run at once, process-wide (one worker process
each); a hot key beyond them asks again at its next replay. A compile that fails, or a worker that
dies, leaves the key on its ATen replay and says why once. Workers are fresh interpreters
(``compile_worker``: a fork or spawn of the serving process would run the user's script again),
killed when the serving process exits, compiles in flight or not. They inherit its environment,
so its Inductor cache (``TORCHINDUCTOR_CACHE_DIR``): a later process compiling the same graph for
the same sizes loads the kernels from disk.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.fx

from npugraph_ex.kernels.compile_worker import read_message, write_message
from npugraph_ex.kernels.cores import background_cores, pin
from npugraph_ex.kernels.graph_bytes import load_graph, pickle_graph
from npugraph_ex.kernels.static_compile import chosen, input_signature, lower, positional
from npugraph_ex.kernels.symbolic import SymbolicSpec, guards_of, symbolic_inputs
from npugraph_ex.runtime.platform import platform_for

log = logging.getLogger(__name__)

InputSpec = tuple[Any, ...]
"""A tensor input's ``("tensor", sizes, strides, dtype, device)``, or ``("value", v)``."""

Job = tuple[Callable[[], tuple[Any, ...]], bool, "list[Any] | None"]
"""What makes a worker's request (``compile_in_worker``'s arguments; called on the worker's
thread, as pickling a graph takes a tenth of a second and more), whether it is a symbolic compile,
and the inputs the kernels it makes are first run on in the loading thread, or None."""


def input_specs(args: Sequence[Any]) -> list[InputSpec]:
    return [
        ("tensor", tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type)
        if isinstance(a, torch.Tensor)
        else ("value", a)
        for a in args
    ]


@dataclass
class MadeKernels:
    """Kernels a worker made, loaded in the serving process."""

    run: Callable[..., Any]
    """Called like the FX graph (positional inputs)."""
    guards: str | None
    """For a symbolic compile: what a key's inputs must satisfy to call them (``symbolic``)."""
    symbolic: bool
    data: bytes
    """As the worker sent them."""
    stored: bool = False
    """Loaded from the compile cache: kept by an earlier process, they need no trial."""


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


def compile_in_worker(
    graph: bytes,
    specs: list[InputSpec],
    device: str,
    use_cache: bool,
    symbolic: list[SymbolicSpec] | None = None,
    threads: int = 0,
) -> tuple[bytes, str | None]:
    """In the worker: the graph lowered for inputs like ``specs`` (with the sizes of
    ``symbolic`` left symbolic, where given), as Inductor's compiled graph serialised for the
    serving process, and the guards of a symbolic compile. ``threads``: the serving process's
    intra-op threads, which Inductor's CPU kernels are written for (the worker, pinned to
    fewer cores, would count its own)."""
    if threads > 0:
        torch.set_num_threads(threads)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    with fake_mode:  # the inputs' layouts, without their memory
        args = [
            torch.empty_strided(spec[1], spec[2], dtype=spec[3], device=spec[4])
            if spec[0] == "tensor"
            else spec[1]
            for spec in specs
        ]
    if symbolic is not None:
        args = symbolic_inputs(symbolic, args, fake_mode)
    compiled = lower(load_graph(graph), args, device, use_cache, fake_mode)
    guards = guards_of(fake_mode, args) if symbolic is not None else None
    compiled.prepare_for_serialization()
    return GraphPickler.dumps(compiled), guards


class Loading:
    """What the first load of compiled kernels in a process does before it loads them, done
    once per process and device in a thread on the background cores as soon as a graph may
    compile in the background (its first call, which compiles and captures anyway): Inductor's
    loading modules imported and, for CPU kernels, the compiler probed for its vector
    instructions (six child processes, about a second; ``pick_vec_isa`` keeps the answer).
    Done in the first load instead, it held the serving thread's calls up to 24 ms."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.devices: set[str] = set()

    def prepare(self, device_type: str, cores: int) -> None:
        with self.lock:
            if device_type in self.devices:
                return
            self.devices.add(device_type)
        threading.Thread(
            target=self.run, args=(device_type, background_cores(cores)), daemon=True
        ).start()

    @staticmethod
    def run(device_type: str, cores: set[int]) -> None:
        pin(0, cores)
        with contextlib.suppress(Exception):  # the first load then does it, as it would
            from torch._inductor import codecache, output_code  # noqa: F401

            if device_type == "cpu":
                from torch._inductor.cpu_vec_isa import pick_vec_isa

                pick_vec_isa()


LOADING = Loading()


def load_compiled(data: bytes) -> Callable[..., Any]:
    """The compiled graph a worker sent, ready to call like the FX graph (positional inputs)."""
    import torch._inductor.debug  # noqa: F401  (a compiled graph's call reads it)
    from torch._inductor.output_code import CompiledFxGraphConstants
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler

    compiled = GraphPickler.loads(data, FakeTensorMode())
    compiled.after_deserialization(CompiledFxGraphConstants())
    return positional(compiled)


class Worker:
    """One worker process (``compile_worker``) and the compile it runs, if any; it and the
    thread loading its results run on ``cores`` (``kernels/cores``), where given."""

    def __init__(self, cores: set[int], done: Callable[[], None]) -> None:
        env = dict(os.environ)
        if cores:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(len(cores))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "npugraph_ex.kernels.compile_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        pin(self.process.pid, cores)
        self.cores = cores
        self.done = done
        """Called when a compile's result is loaded, or failed."""
        self.future: Future | None = None
        self.warm_args: Sequence[Any] | None = None
        self.symbolic = False

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def start(self, job: Job, future: Future) -> None:
        request, self.symbolic, self.warm_args = job
        self.future = future
        thread = threading.Thread(
            target=self.run, args=(request,), name="npugraph_ex-compile", daemon=True
        )
        thread.start()

    def run(self, request: Callable[[], tuple[Any, ...]]) -> None:
        """On this worker's thread: the request made and sent (a write the pipe takes only as
        the worker reads it, after its start of a second or two), then the reply, loaded (the
        first load in a process builds and imports Inductor's bindings, about a second). None
        of it is the serving thread's wait. The load runs on the worker's cores: its compiler
        probes are processes too."""
        pin(0, self.cores)
        try:
            write_message(self.process.stdin, request())
            reply = read_message(self.process.stdout)
        except OSError:  # the worker died before it took the request
            reply = None
        future, self.future = self.future, None
        warm_args, self.warm_args = self.warm_args, None
        try:
            if reply is None:
                raise RuntimeError("the compile worker process exited")
            if not reply[0]:
                raise RuntimeError(reply[1])
            data, guards = reply[1]
            interval = sys.getswitchinterval()
            sys.setswitchinterval(0.0002)
            try:
                kernels = load_compiled(data)
            finally:
                sys.setswitchinterval(interval)
            if warm_args is not None:
                with torch.no_grad():
                    kernels(*warm_args)  # lazily made state, made here, not in a call
            made = MadeKernels(kernels, guards, self.symbolic, data)
        except Exception as error:  # a failed compile, or a result this process cannot load
            self.done()
            future.set_exception(error)
            return
        self.done()
        future.set_result(made)

    def stop(self) -> None:
        if self.alive:
            self.process.kill()
            self.process.wait()


class Workers:
    """The process-wide worker processes, one per compile in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: list[Worker] = []
        self.in_flight = 0
        """Compiles sent and not yet loaded (or failed): while any is, replays of tiered keys
        leave the background cores to them (``kernels/cores``)."""

    def finished(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def submit(self, limit: int, make: Callable[[], Job], cores: int = 0) -> Future | None:
        """A compile of the job ``make()`` builds started (the request and the inputs its
        kernels are first run on, if any, before they are ready), or None while ``limit``
        compiles are in flight; ``make`` is called only when a worker is free. A new worker
        runs on the last ``cores`` cores (``kernels/cores``)."""
        with self.lock:
            self.workers = [w for w in self.workers if w.alive or w.future is not None]
            idle = [w for w in self.workers if w.future is None]
            if not idle and len(self.workers) >= limit:
                return None
            job = make()
            worker = idle[0] if idle else Worker(background_cores(cores), self.finished)
            if not idle:
                self.workers.append(worker)
            future: Future = Future()
            self.in_flight += 1  # under the lock: the worker's ``finished`` waits for it
            worker.start(job, future)
        return future

    def shutdown(self) -> None:
        with self.lock:
            workers, self.workers = self.workers, []
        for worker in workers:
            worker.stop()


WORKERS = Workers()
atexit.register(WORKERS.shutdown)


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
        LOADING.prepare(device_type, self.cores)
        """The intra-op threads of calls, read here: a replay during a compile runs with fewer
        (``kernels/cores``)."""
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

    def forget(self, future: Future) -> None:
        """Stored kernels that failed to load: the keys compile as if there were none."""
        self.stored = {k: f for k, f in self.stored.items() if f is not future}

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
