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
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import torch
import torch.fx

from npugraph_ex.kernels.compile_worker import read_message, write_message
from npugraph_ex.kernels.graph_bytes import load_graph, pickle_graph
from npugraph_ex.kernels.static_compile import chosen, input_signature, lower, positional
from npugraph_ex.runtime.platform import platform_for

log = logging.getLogger(__name__)

InputSpec = tuple[Any, ...]
"""A tensor input's ``("tensor", sizes, strides, dtype, device)``, or ``("value", v)``."""

Job = tuple[tuple[Any, ...], "list[Any] | None"]
"""A worker's request (``compile_in_worker``'s arguments), and the inputs the kernels it makes
are first run on in the loading thread, or None."""


def input_specs(args: Sequence[Any]) -> list[InputSpec]:
    return [
        ("tensor", tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type)
        if isinstance(a, torch.Tensor)
        else ("value", a)
        for a in args
    ]


def compile_in_worker(graph: bytes, specs: list[InputSpec], device: str, use_cache: bool) -> bytes:
    """In the worker: the graph lowered for inputs like ``specs``, as Inductor's compiled graph
    serialised for the serving process."""
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
    compiled = lower(load_graph(graph), args, device, use_cache, fake_mode)
    compiled.prepare_for_serialization()
    return GraphPickler.dumps(compiled)


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
    """One worker process (``compile_worker``) and the compile it runs, if any."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "npugraph_ex.kernels.compile_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.future: Future | None = None
        self.warm_args: Sequence[Any] | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def start(
        self, request: tuple[Any, ...], future: Future, warm_args: Sequence[Any] | None
    ) -> None:
        self.future, self.warm_args = future, warm_args
        write_message(self.process.stdin, request)
        threading.Thread(target=self.wait, name="npugraph_ex-compile", daemon=True).start()

    def wait(self) -> None:
        """On this worker's thread: the reply, loaded (the first load in a process builds and
        imports Inductor's bindings, about a second, which the serving thread must not wait
        for)."""
        reply = read_message(self.process.stdout)
        future, self.future = self.future, None
        warm_args, self.warm_args = self.warm_args, None
        if reply is None:
            future.set_exception(RuntimeError("the compile worker process exited"))
        elif not reply[0]:
            future.set_exception(RuntimeError(reply[1]))
        else:
            try:
                kernels = load_compiled(reply[1])
                if warm_args is not None:
                    with torch.no_grad():
                        kernels(*warm_args)  # lazily made state, made here, not in a call
                future.set_result(kernels)
            except Exception as error:  # a result this process cannot load: ATen stays
                future.set_exception(error)

    def stop(self) -> None:
        if self.alive:
            self.process.kill()
            self.process.wait()


class Workers:
    """The process-wide worker processes, one per compile in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: list[Worker] = []

    def submit(self, limit: int, make: Callable[[], Job]) -> Future | None:
        """A compile of the job ``make()`` builds started (the request and the inputs its
        kernels are first run on, if any, before they are ready), or None while ``limit``
        compiles are in flight; ``make`` is called only when a worker is free."""
        with self.lock:
            self.workers = [w for w in self.workers if w.alive or w.future is not None]
            idle = [w for w in self.workers if w.future is None]
            if not idle and len(self.workers) >= limit:
                return None
            request, warm_args = make()
            worker = idle[0] if idle else Worker()
            if not idle:
                self.workers.append(worker)
            future: Future = Future()
            try:
                worker.start(request, future, warm_args)
            except OSError as error:  # the worker died before it took the request
                worker.future = None
                future.set_exception(error)
        return future

    def shutdown(self) -> None:
        with self.lock:
            workers, self.workers = self.workers, []
        for worker in workers:
            worker.stop()


WORKERS = Workers()
atexit.register(WORKERS.shutdown)


class BackgroundKernels:
    """The background compiles of one graph's keys (see the module docstring)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        device_type: str,
        config: Any,
        synchronize: Callable[[], None],
    ):
        self.gm = gm
        self.device_type = device_type
        self.use_cache = not config.disable_static_kernel_compile_cache
        self.after = config.background_compile_after
        self.limit = config.background_compiles_in_flight
        self.min_gain = config.background_min_gain
        self.chooses = config.static_kernels_for
        self.synchronize = synchronize
        """Waits for the device's queued work (a timed call ends when its kernels do)."""
        self.graph: bytes | None = None
        """The graph in the cache's format, made at the first request."""
        self.made: dict[tuple, Future] = {}
        """Compiles by input layouts: a key captured again (an input moved) reuses its own."""
        self.compiles = 0
        """Compiles sent to a worker for this graph."""

    def request(self, args: Sequence[Any], kept: Sequence[int] = ()) -> Future | None:
        """Start compiling kernels for inputs like ``args`` (this call's values: they were just
        staged): a future of them, callable like the graph; None while the workers are busy.
        Where their capture is their first run (CPU), the loading thread runs them once first,
        on copies of every input but those at ``kept`` (parameters and buffers, which the graph
        never writes): the call that swaps them in then pays no first-run costs (oneDNN's
        primitives, say), and the staged buffers, which other keys' replays reuse, are not
        read later."""
        signature = input_signature(args)
        made = self.made.get(signature)
        if made is not None and not (made.done() and made.exception() is not None):
            return made
        future = WORKERS.submit(self.limit, lambda: self.job(args, kept))
        if future is not None:
            self.made[signature] = future
            self.compiles += 1
        return future

    def job(self, args: Sequence[Any], kept: Sequence[int]) -> Job:
        """The request for a worker, and the copies of ``args`` the kernels first run on."""
        if self.graph is None:
            self.graph = pickle_graph(self.gm)
        request = (self.graph, input_specs(args), self.device_type, self.use_cache)
        if platform_for(self.device_type).warms_up("kernels"):
            return request, None
        warm_args = [
            a if i in kept or not isinstance(a, torch.Tensor) else a.clone()
            for i, a in enumerate(args)
        ]
        return request, warm_args

    def wants(self, args: Sequence[Any]) -> bool:
        return chosen(self.chooses, args)
