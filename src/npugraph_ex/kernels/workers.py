"""The worker processes of background compiles, and the loading of what they make.

A compile goes to a worker process (``compile_worker``: a fresh interpreter; a fork or spawn of
the serving process would run the user's script again) as the graph in the compile cache's format
and its inputs' layouts; the worker lowers it with Inductor and sends back Inductor's compiled
graph, serialised. A thread of the serving process, one per compile, makes and writes the request
(pickling a graph takes a tenth of a second and more, and the pipe takes it only as a new worker,
a second or two after its start, reads it), waits for the reply and loads it (about 2 ms; the
first time in a process Inductor imports its loading modules and probes the compiler, which
``Loading`` does ahead, at the first compile). The serving thread never waits for any of it.

    serving thread:  request -> replay  replay  replay ...                  future done? -> swap
    worker thread:   pickle, write   ...  read reply, load, first run  -> future
    worker process:            trace, lower (seconds)  -> bytes

At most ``background_compiles_in_flight`` compiles run at once, process-wide (``WORKERS``, one
worker process each). Worker, compiler and loading run on the background cores (``cores``).
Workers are killed when the serving process exits, compiles in flight or not. They inherit its
environment, so its Inductor cache (``TORCHINDUCTOR_CACHE_DIR``): a later process compiling the
same graph for the same sizes loads the kernels from disk.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from npugraph_ex.kernels.compile_worker import read_message, write_message
from npugraph_ex.kernels.cores import background_cores, pin
from npugraph_ex.kernels.graph_bytes import load_graph
from npugraph_ex.kernels.static_compile import lower, positional
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
    loading modules imported, and what the device's platform does first
    (``Platform.prepare_kernel_loading``: on CPU, the compiler probed, about a second).
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

            platform_for(device_type).prepare_kernel_loading()


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
        except Exception as error:  # the request could not be made: the graph did not pickle
            reply = (False, f"{type(error).__name__}: {str(error).splitlines()[0][:500]}")
        future, self.future = self.future, None
        warm_args, self.warm_args = self.warm_args, None
        try:
            if reply is None:
                raise RuntimeError("the compile worker process exited")
            if not reply[0]:
                raise RuntimeError(reply[1])
            data, guards = reply[1]
            # The serving thread waits for the interpreter lock in slices of this interval
            # while the load runs Python code: short slices, while it lasts (milliseconds).
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
