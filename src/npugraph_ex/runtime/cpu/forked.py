"""A child forked from a process that ran parallel kernels starts with one intra-op thread.

GNU OpenMP, which torch's Linux CPU build and Inductor's C++ kernels run their parallel loops
on, keeps a team of threads from the first parallel region on. ``fork()`` copies only the
forking thread, and the child's next parallel region waits for a team that is not there: the
child hangs, in eager ops as in a replay or compiled kernels (a ``2000 x 2000`` ``mm`` run in the
parent, then in the child, hangs the child here). PyTorch leaves it to the user (its DataLoader
gives its workers one thread); a pre-fork server that warmed its model before forking meets it
on its first request. So a process that captured a graph with more than one intra-op thread
(``ran_parallel``) gives its forked children one thread (``torch.set_num_threads(1)``) and says
so once in each: the child serves, on one core. Dynamo guards the thread count its functions
were compiled with, so each compiled function traces and captures once more in the child.
Children started by ``spawn`` or ``forkserver`` keep every core.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

log = logging.getLogger("npugraph_ex")


class ForkedChildren:
    """Whether this process ran parallel work a forked child would wait for."""

    def __init__(self) -> None:
        self.parallel = False

    def ran_parallel(self) -> None:
        """A capture ran (and its replays will run) at the current intra-op thread count."""
        if not self.parallel and torch.get_num_threads() > 1:
            self.parallel = True

    def after_fork_in_child(self) -> None:
        if not self.parallel or torch.get_num_threads() == 1 or not gnu_openmp_loaded():
            return
        torch.set_num_threads(1)
        log.warning(
            "npugraph_ex: this process was forked after running parallel kernels, and GNU "
            "OpenMP cannot start their threads again in a forked child: the child runs with 1 "
            "intra-op thread (torch.set_num_threads(1)), and its compiled functions compile "
            "again for it. Start children with multiprocessing's 'spawn' or 'forkserver' "
            "method to keep every core."
        )


def gnu_openmp_loaded() -> bool:
    """Whether GNU OpenMP (``libgomp``) is mapped into this process (Linux; elsewhere the
    OpenMP runtime, LLVM's, starts its threads again after a fork)."""
    maps = Path("/proc/self/maps")
    try:
        return "libgomp" in maps.read_text()
    except OSError:
        return False


FORKED_CHILDREN = ForkedChildren()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=FORKED_CHILDREN.after_fork_in_child)
