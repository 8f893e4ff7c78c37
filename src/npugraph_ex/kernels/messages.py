"""The messages between the serving process and a compile process: each a pickle preceded by its
length (8 bytes, little-endian), over the compile process's stdin and stdout."""

from __future__ import annotations

import pickle
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct("<Q")


def message(value: Any) -> bytes:
    """``value`` as one message, ready to write."""
    data = pickle.dumps(value)
    return HEADER.pack(len(data)) + data


def write_message(stream: BinaryIO, data: bytes) -> None:
    """Write a message made by ``message``."""
    stream.write(data)
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
    return pickle.loads(data)  # noqa: S301 - between a process and the one it started
