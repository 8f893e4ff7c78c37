"""A compile process: ``python -m npugraph_ex.kernels.worker_process IDLE_SECONDS CORES``
(``CORES``: the comma-separated cores it keeps itself and its compilers on; empty: any).

A fresh interpreter (not a fork or a spawn of the serving process, which would import the user's
script again): it reads requests from stdin and writes results to stdout (``messages``). A
request is a graph's frame, then a message of ``remote_compile.compile_in_worker``'s other
arguments; a result is ``(True, (compiled
bytes, guards, loading facts))`` or ``(False, "ErrorType: message")``. It exits when stdin closes,
or after ``IDLE_SECONDS`` without a request, so that a quiet serving process holds no second
interpreter (``processes`` starts another on demand).
"""

from __future__ import annotations

import os
import select
import sys
from typing import Any, BinaryIO

from npugraph_ex.errors import error_summary
from npugraph_ex.kernels.messages import message, read_frame, read_message, write_message


def serve(requests: BinaryIO, results: BinaryIO, idle_seconds: float) -> None:
    from npugraph_ex.kernels.remote_compile import compile_in_worker

    while select.select([requests], [], [], idle_seconds)[0]:
        graph = read_frame(requests)
        request = read_message(requests) if graph is not None else None
        if request is None:
            return
        try:
            result: tuple[bool, Any] = (True, compile_in_worker(graph, *request))
        except Exception as error:  # reported to the serving process, which keeps ATen
            result = (False, error_summary(error, 500))
        write_message(results, message(result))


def main() -> None:
    idle_seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    cores = sys.argv[2] if len(sys.argv) > 2 else ""
    if cores and hasattr(os, "sched_setaffinity"):  # before torch loads; children inherit it
        os.sched_setaffinity(0, {int(core) for core in cores.split(",")})
    # Results go to the original stdout; anything a compile prints goes to stderr instead.
    results = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, results, idle_seconds)


if __name__ == "__main__":
    main()
