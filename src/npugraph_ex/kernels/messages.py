"""The messages between the serving process and a compile process, over the compile process's
stdin and stdout: each a frame, its bytes preceded by their length (8 bytes, little-endian); a
message's bytes are a pickle, a graph's are the graph's own (``graph_bytes``), framed once when
they are made so that a request copies nothing large in the serving thread."""

from __future__ import annotations

import pickle
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct("<Q")


def frame(data: bytes) -> bytes:
    """``data`` framed, ready to write."""
    return HEADER.pack(len(data)) + data


def message(value: Any) -> bytes:
    """``value`` as one framed message, ready to write."""
    return frame(pickle.dumps(value))


def write_message(stream: BinaryIO, *frames: bytes) -> None:
    """Write frames made by ``frame`` or ``message``."""
    for data in frames:
        stream.write(data)
    stream.flush()


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's bytes, or None when the stream has ended."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    data = stream.read(size)
    return data if len(data) == size else None


def read_message(stream: BinaryIO) -> Any:
    """The next message, or None when the stream has ended."""
    data = read_frame(stream)
    if data is None:
        return None
    return pickle.loads(data)  # noqa: S301 - between a process and the one it started
