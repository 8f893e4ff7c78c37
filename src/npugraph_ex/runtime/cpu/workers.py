"""The threads that run stream blocks on CPU, and the task a block becomes in one replay.

One worker thread per tag, for the process's life, takes the tag's blocks in the order they are
submitted. Waking a sleeping thread costs tens to hundreds of microseconds on some hosts (a
virtual machine's), about what a small block computes in, so whoever needs a block first runs it:

    main:    submit(B) ... work of its own ... join(B)
    worker:        (wakes) claims B, runs it        -> the join waits for it
    or:                                 B still unclaimed at the join -> main runs it itself

A block runs once, by the first thread to claim it; before its own kernels it waits for the
block of its tag submitted before it (a tag's blocks keep their order whoever runs them) and
for the blocks it joins (``after``). Its error is raised to every thread that waits for it.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence

import torch


class BlockTask:
    """One stream block in one replay."""

    def __init__(
        self,
        run: Callable[[], None],
        previous: BlockTask | None,
        after: Sequence[BlockTask],
        threads: int,
    ):
        self.run = run
        self.previous = previous
        self.after = after
        self.threads = threads
        self.claimed = False
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def claim(self) -> bool:
        with self.lock:
            taken, self.claimed = self.claimed, True
        return not taken

    def run_claimed(self) -> None:
        try:
            for task in (self.previous, *self.after):
                if task is not None:
                    task.wait()
            # A thread keeps its own intra-op thread count: the block gets the one the main
            # path had when it submitted the block, and the thread that ran it gets its own back
            # (a join inside a limit_core_num block may run the block on the main path).
            own = torch.get_num_threads()
            if own != self.threads:
                torch.set_num_threads(self.threads)
            try:
                # Below autograd, as on the main path (the mode is per thread).
                with torch._C._AutoDispatchBelowADInplaceOrView():
                    self.run()
            finally:
                if own != self.threads:
                    torch.set_num_threads(own)
        except BaseException as error:  # noqa: BLE001  (raised again to whoever waits)
            self.error = error
        finally:
            self.previous = None
            self.done.set()

    def finish(self) -> None:
        """Run the block here if no thread has claimed it yet; else wait for it to finish."""
        if self.claim():
            self.run_claimed()
        self.done.wait()

    def wait(self) -> None:
        """``finish``, then raise what the block raised."""
        self.finish()
        if self.error is not None:
            raise self.error


class Worker:
    """A daemon thread running the tasks put to it, unless another thread claimed them first."""

    def __init__(self, tag: str):
        self.tasks: queue.SimpleQueue[BlockTask] = queue.SimpleQueue()
        thread = threading.Thread(target=self.serve, name=f"npugraph_ex-{tag}", daemon=True)
        thread.start()

    def serve(self) -> None:
        while True:
            task = self.tasks.get()
            if task.claim():
                task.run_claimed()

    def submit(self, task: BlockTask) -> None:
        self.tasks.put(task)


WORKERS: dict[str, Worker] = {}
WORKERS_LOCK = threading.Lock()


def forget_workers_in_child() -> None:
    """In a forked child: the parent's worker threads did not come along (and one may have
    held the lock at the fork); the child starts its own as its blocks ask."""
    global WORKERS_LOCK
    WORKERS_LOCK = threading.Lock()
    WORKERS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_workers_in_child)


def worker(tag: str) -> Worker:
    """The thread that runs the blocks of ``tag`` (one per tag, for the process's life)."""
    with WORKERS_LOCK:
        if tag not in WORKERS:
            WORKERS[tag] = Worker(tag)
        return WORKERS[tag]
