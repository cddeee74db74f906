"""The output of a ``flightgroup run``: framed records, spooled or captured.

A record is one byte for the stream (1 stdout, 2 stderr), a 4-byte big-endian
length, then that many bytes: stdout and stderr stay apart in one file, and a
reader that meets a record cut short by a write in progress keeps it for the next
read. In the directory scope the leader appends the records to a spool file under
the directory (``DIR/output/<sha256 hex of the key>.<token>``) that joiners follow
while it grows; in the fleet scope, with no shared directory, it keeps them in
memory (up to a byte budget) and hands them over in the flight's value.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import os
import struct
import threading

__all__ = [
    "STDERR",
    "STDOUT",
    "Capture",
    "RecordReader",
    "SpoolWriter",
    "decode_records",
    "prune_spools",
    "spool_path",
]

STDOUT = 1
STDERR = 2
_HEADER = struct.Struct(">BI")
# Spools of one key kept after a new flight of it starts: a slow joiner of a recent
# flight that opens its spool by name at the end still finds it.
KEEP_SPOOLS = 3


def output_folder(directory: str) -> str:
    """The folder of the spools of a directory group."""
    return os.path.join(directory, "output")


def _key_hex(key: str) -> str:
    # surrogatepass: a key may hold a lone surrogate (the directory scope allows it).
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def spool_path(directory: str, key: str, token: int) -> str:
    """Where the flight ``token`` of ``key`` spools its output."""
    return os.path.join(output_folder(directory), f"{_key_hex(key)}.{token}")


def prune_spools(directory: str, key: str, keep: int = KEEP_SPOOLS) -> None:
    """Remove the oldest spools of ``key`` so that ``keep`` remain (by token)."""
    prefix = _key_hex(key) + "."
    found: list[tuple[int, str]] = []
    with contextlib.suppress(OSError):
        for name in os.listdir(output_folder(directory)):
            if name.startswith(prefix) and name[len(prefix) :].isdigit():
                found.append((int(name[len(prefix) :]), name))
    found.sort()
    for _, name in found[: max(0, len(found) - keep)]:
        with contextlib.suppress(OSError):  # another leader may prune it first
            os.unlink(os.path.join(output_folder(directory), name))


def frame(stream: int, data: bytes) -> bytes:
    """One record."""
    return _HEADER.pack(stream, len(data)) + data


class SpoolWriter:
    """Appends records to a new spool file (mode 0600), one whole record at a time."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self.path = path
        self._fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        self._lock = threading.Lock()  # two pump threads: records never interleave

    def write(self, stream: int, data: bytes) -> None:
        """Append one record."""
        record = memoryview(frame(stream, data))
        with self._lock:
            while record:
                record = record[os.write(self._fd, record) :]

    def close(self) -> None:
        """Close the file (it stays for the joiners)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class Capture:
    """Records kept in memory for the fleet scope, at most ``budget`` bytes framed:
    past it the oldest records go (the end of an output says most about how it
    ended) and ``dropped`` counts their bytes."""

    def __init__(self, budget: int) -> None:
        self._budget = max(0, budget)
        self._records: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self.dropped = 0

    def write(self, stream: int, data: bytes) -> None:
        """Keep one record (its tail alone if it is larger than the budget)."""
        room = self._budget - _HEADER.size
        with self._lock:
            if len(data) > room:
                kept = data[len(data) - room :] if room > 0 else b""
                self.dropped += len(data) - len(kept)
                if not kept:
                    return
                data = kept
            record = frame(stream, data)
            self._records.append(record)
            self._size += len(record)
            while self._size > self._budget:
                old = self._records.popleft()
                self._size -= len(old)
                self.dropped += len(old) - _HEADER.size

    def encode(self) -> str:
        """The kept records, base64 (for a JSON value)."""
        with self._lock:
            return base64.b64encode(b"".join(self._records)).decode("ascii")


class RecordReader:
    """Parses records from bytes that arrive in pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The records completed by ``data``; a partial one waits for the rest."""
        self._buffer += data
        records: list[tuple[int, bytes]] = []
        at = 0
        while len(self._buffer) - at >= _HEADER.size:
            stream, length = _HEADER.unpack_from(self._buffer, at)
            end = at + _HEADER.size + length
            if end > len(self._buffer):
                break
            records.append((stream, bytes(self._buffer[at + _HEADER.size : end])))
            at = end
        del self._buffer[:at]
        return records

    @property
    def pending(self) -> int:
        """Bytes of a record not complete yet."""
        return len(self._buffer)


def decode_records(text: str) -> list[tuple[int, bytes]]:
    """The records of a :meth:`Capture.encode` string."""
    return RecordReader().feed(base64.b64decode(text))
