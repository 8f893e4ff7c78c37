"""The compile processes of the kernel tier, and the threads that talk to them.

A compile goes to a compile process (``worker_process``: a fresh interpreter) as one message made
in the serving thread when the key turns hot (the graph's bytes were made at its first capture,
``KernelTier.prepare``). A thread per compile writes it and waits for the reply: blocking reads
and writes, which leave the interpreter lock to the serving thread. The reply's bytes are handed
to the ``Compile`` record as they are; loading them is the serving thread's, at a call boundary
(``kernels/loading``).

    serving thread:   hot: message -> replay  replay  replay ... received? load -> ... swap
    exchange thread:  write message ... read reply (blocked)  -> Compile.received
    compile process:          trace, lower (seconds)  -> bytes

At most ``background_compiles_in_flight`` compiles run at once, process-wide (``PROCESSES``, one
compile process each). A compile process and its compiler run on the background cores
(``cores``). Processes are killed when the serving process exits; one idle for
``IDLE_SECONDS`` exits by itself, and one idle for half that is not given new work (it is
stopped and a fresh one started), so no request meets a process on its way out. Compile
processes inherit the serving process's environment, so its Inductor cache
(``TORCHINDUCTOR_CACHE_DIR``): a later process compiling the same graph for the same sizes loads
the kernels from disk.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from npugraph_ex.kernels.cores import background_cores
from npugraph_ex.kernels.messages import read_message, write_message

IDLE_SECONDS = 60.0
"""How long a compile process waits for a request before it exits."""
FORKED = -1000
"""The return code a forked child gives the parent's processes (``disown``): never polled."""


def ignore_reply(answer: Any) -> None:
    """The reply of a process that was never sent a request."""


class CompileProcess:
    """One compile process and the compile it runs, if any."""

    def __init__(self, cores: set[int]) -> None:
        env = dict(os.environ)
        if cores:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(len(cores))
        # The process pins itself to ``cores`` as it starts: pinning it from here, mid-exec,
        # took the serving thread 4 ms.
        command = [sys.executable, "-m", "npugraph_ex.kernels.worker_process", str(IDLE_SECONDS)]
        self.process = subprocess.Popen(
            [*command, ",".join(map(str, sorted(cores)))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.busy = False
        self.idle_since = time.monotonic()
        self.thread: threading.Thread | None = None
        """The thread of the request in flight, or of the last one."""
        self.reply: Callable[[Any], None] = ignore_reply
        """Where the reply of the request in flight, or of the last one, goes."""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def fresh(self) -> bool:
        """Alive and idle for less than half ``IDLE_SECONDS``: safe to give a request."""
        return self.alive and time.monotonic() - self.idle_since < IDLE_SECONDS / 2

    def start(self, request: Sequence[bytes], reply: Callable[[Any], None], seconds: float) -> None:
        """Send ``request`` from a thread of its own, which calls ``reply`` with the reply (or
        None when the process died, or a failure when it took more than ``seconds``)."""
        self.busy = True
        self.reply = reply
        self.thread = threading.Thread(
            target=self.exchange, args=(request, seconds), name="npugraph_ex-compile", daemon=True
        )
        self.thread.start()

    def exchange(self, request: Sequence[bytes], seconds: float) -> None:
        try:
            write_message(self.process.stdin, *request)
            if select.select([self.process.stdout], [], [], seconds)[0]:
                answer = read_message(self.process.stdout)
            else:  # a hung compile: the process goes, the next compile gets a new one
                self.process.kill()
                self.process.wait()  # reaped before the reply: never ``alive`` to a new request
                answer = (
                    False,
                    f"the compile took more than {seconds:g} s: its process was killed",
                )
        except (OSError, ValueError):  # the process died, or was stopped, before it answered
            answer = None
        self.busy = False
        self.idle_since = time.monotonic()
        self.reply(answer)

    def disown(self) -> None:
        """In a forked child: close this process's copies of the pipes and answer the compile
        in flight as failed (its thread, and so its reply, stayed in the parent)."""
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                release_descriptor(pipe.fileno())
        self.process.returncode = FORKED  # not the child's to wait for or kill
        if self.busy:
            self.busy = False
            self.reply((False, "the process forked while this compile ran for its parent"))

    def stop(self) -> None:
        """Kill the process and wait for its request's thread, which then replies None."""
        if self.alive:
            self.process.kill()
            self.process.wait()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=10)


def release_descriptor(fd: int) -> None:
    """Drop this process's reference to what ``fd`` names, keeping the number taken (by
    ``/dev/null``): the file object holding it is not closed here (closing takes its lock,
    which the parent's exchange thread held, blocked on the pipe, at the fork), and when it is
    collected it closes its own number, not one reused since."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, fd)
        os.close(devnull)


class CompileProcesses:
    """The process-wide compile processes, one per compile in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.processes: list[CompileProcess] = []
        self.in_flight = 0
        """Compiles in a compile process, and loaded kernels in their first run: while any is,
        replays of tiered keys leave the background cores to them (``cores``)."""

    def submit(
        self,
        limit: int,
        request: Callable[[], Sequence[bytes]],
        reply: Callable[[Any], None],
        cores: int,
        seconds: float,
    ) -> bool:
        """Send the frames ``request()`` makes (called only when a process is free) to a free
        compile process, its reply to ``reply`` (a failure after ``seconds``); False while
        ``limit`` compiles are in flight. A new process runs on the last ``cores`` cores
        (``cores``)."""
        with self.lock:
            stale = [p for p in self.processes if not p.busy and not p.fresh]
            self.processes = [p for p in self.processes if p.busy or p.fresh]
            sent = self.in_flight < limit
            if sent:
                idle = [p for p in self.processes if not p.busy]
                process = idle[0] if idle else CompileProcess(background_cores(cores))
                if not idle:
                    self.processes.append(process)
                self.in_flight += 1
                process.start(request(), reply, seconds)
        for process in stale:  # unlocked: its thread may still be replying, which takes the lock
            process.stop()
        return sent

    def entered(self) -> None:
        """Loaded kernels began their first run on the background cores (``tier``)."""
        with self.lock:
            self.in_flight += 1

    def finished(self) -> None:
        """A compile left flight: its reply came, its first run ended, or it failed."""
        with self.lock:
            self.in_flight -= 1

    def forget_in_child(self) -> None:
        """In a forked child (``os.register_at_fork``): the parent's processes are disowned, the
        lock, which a parent's thread may have held at the fork, is new."""
        self.lock = threading.Lock()
        processes, self.processes = self.processes, []
        for process in processes:
            process.disown()
        self.in_flight = 0

    def shutdown(self) -> None:
        with self.lock:
            processes, self.processes = self.processes, []
        for process in processes:
            process.stop()


PROCESSES = CompileProcesses()
# At exit, before the interpreter finalizes: a request's thread still running then would reply
# to a dead process by dropping tensors (a compile's input copies), which releases the
# interpreter lock inside torch's C++ and aborts the process when it takes the lock back.
atexit.register(PROCESSES.shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=PROCESSES.forget_in_child)
