"""The worker process of background compiles: ``python -m npugraph_ex.kernels.compile_worker``.

A fresh interpreter (not a fork or a spawn of the serving process, which would import the user's
script again): it reads requests from stdin and writes results to stdout, each a pickle preceded
by its length (8 bytes, little-endian). A request is ``(graph, specs, device, use_cache,
symbolic, threads)`` (``workers.compile_in_worker``'s arguments); a result is ``(True,
(compiled bytes, guards))`` or ``(False, "ErrorType: message")``. It exits when stdin closes.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import Any, BinaryIO

HEADER = struct.Struct("<Q")


def write_message(stream: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: BinaryIO) -> Any:
    """The next message, or None when the stream has ended."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)  # noqa: S301 - from the process that started this one


def serve(requests: BinaryIO, results: BinaryIO) -> None:
    from npugraph_ex.kernels.workers import compile_in_worker

    while (request := read_message(requests)) is not None:
        try:
            result: tuple[bool, Any] = (True, compile_in_worker(*request))
        except Exception as error:  # reported to the serving process, which keeps ATen
            result = (False, f"{type(error).__name__}: {str(error).splitlines()[0][:500]}")
        write_message(results, result)


def main() -> None:
    # Results go to the original stdout; anything a compile prints goes to stderr instead.
    results = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, results)


if __name__ == "__main__":
    main()
