"""Cache files: a readable JSON header and a checked binary payload, written so faults lose nothing.

    NPUGRAPH_EX_CACHE\\n
    {"format": 1, "payload_sha256": "...", "payload_bytes": 123, ...}\\n
    <payload>

- Writes are atomic: the bytes go to a private temporary file in the same folder (``mkstemp``
  makes it 0600), which then replaces the entry with ``os.replace``. A reader sees the old file
  or the new one, never half of one; a crash leaves at most a stray ``*.tmp``.
- Writers of one entry take turns under an exclusive ``flock`` on ``<entry>.lock``, so each
  merges what the previous one wrote instead of overwriting it.
- Reading checks, before anything is unpickled: the owner is this user and nobody else may read
  or write the file (a cache someone else could edit is code someone else could run), the magic
  line, the format version, the payload's length and its sha256. Any failure is a
  :class:`CacheFileError` naming the file and what is wrong.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from npugraph_ex.errors import NpuGraphExError

MAGIC = b"NPUGRAPH_EX_CACHE\n"
FORMAT = 3
"""Version of the file layout and of the records in the payload; another version is rebuilt."""


class CacheFileError(NpuGraphExError):
    """A cache file that cannot be used: missing parts, corrupt, another format, or not private."""


def write_entry(path: Path, header: dict[str, Any], payload: bytes) -> None:
    """Write ``header`` and ``payload`` to ``path`` atomically, readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    header = {
        **header,
        "format": FORMAT,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "payload_bytes": len(payload),
    }
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(MAGIC)
            stream.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header of the cache file at ``path`` and the offset where its payload starts."""
    check_private(path)
    with open(path, "rb") as stream:
        if stream.read(len(MAGIC)) != MAGIC:
            raise CacheFileError(f"{path}: not an npugraph_ex cache file (no magic line)")
        line = stream.readline()
        offset = stream.tell()
    try:
        header = json.loads(line)
    except ValueError as error:
        raise CacheFileError(f"{path}: unreadable header ({error})") from None
    if not isinstance(header, dict):
        raise CacheFileError(f"{path}: unreadable header (not an object)")
    if header.get("format") != FORMAT:
        raise CacheFileError(
            f"{path}: cache format {header.get('format')!r}, this version reads {FORMAT}"
        )
    return header, offset


def read_entry(path: Path) -> tuple[dict[str, Any], bytes]:
    """The header and the checked payload of the cache file at ``path``."""
    header, offset = read_header(path)
    with open(path, "rb") as stream:
        stream.seek(offset)
        payload = stream.read()
    if len(payload) != header.get("payload_bytes"):
        raise CacheFileError(
            f"{path}: truncated: {len(payload)} payload bytes, the header says "
            f"{header.get('payload_bytes')}"
        )
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise CacheFileError(f"{path}: corrupt: the payload does not match its checksum")
    return header, payload


def check_private(path: Path) -> None:
    """Raise unless ``path`` is a regular file of this user that no one else can read or write."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(path) from None
    except OSError as error:
        raise CacheFileError(f"{path}: cannot be read ({error})") from None
    if not stat.S_ISREG(info.st_mode):
        raise CacheFileError(f"{path}: not a regular file")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CacheFileError(f"{path}: owned by another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        raise CacheFileError(
            f"{path}: other users may read or write it (mode {stat.filemode(info.st_mode)}); "
            "cache files must be private (0600)"
        )


@contextlib.contextmanager
def entry_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the entry at ``path`` (no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
