"""The kept outcomes of a directory group on disk: ``state/kept/<sha256 of the key>``, one
file per key whose outcome a coordinator keeps (Retention), so that the next coordinator
serves them until their time runs out (ADR 0039).

Only the coordinator writes here, on its event loop, in the order it decides: a file is
written when it keeps an outcome and removed when the outcome leaves its store (replaced,
evicted, expired, dropped by a newer outcome or a ``forget``). The next term starts only
after this one resigned (``flight.lock``), so it reads every write and removal made
before; a process's death undoes none of them (the page cache is the kernel's).

A file::

    b"flightgroup-kept 1\\n"           the magic line
    4 bytes, big-endian                 the header's length
    4 bytes, big-endian                 CRC-32 of the header and the payload
    header                              compact ASCII JSON: "key", "token", "boot",
                                        "expires", "at", and the outcome's fields as
                                        a ``land`` carries them (wire.outcome_fields)
    payload                             a value's encoded bytes (nothing for a failure)

``expires`` and ``at`` (when it was kept) are ``time.monotonic()`` readings: on Linux
CLOCK_MONOTONIC is one clock for every process of the host, and ``boot`` (the kernel's
boot id) says which boot it counted. A file is served only when it is whole (its CRC),
names its own key (its file name), was kept in this boot, and has between 0 and its
``keep`` seconds left; anything else is removed unread further, never served.
No fsync: the monotonic clock does not survive a reboot, so neither need the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import stat
import struct
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any, Final

from . import fs, wire
from .wire.framing import ENCODER

__all__ = ["KEPT", "KeptFiles", "Record", "boot_id"]

log = logging.getLogger("flightgroup")

KEPT: Final = "kept"  # state/kept/
_MAGIC: Final = b"flightgroup-kept 1\n"
_PREFIX: Final = struct.Struct(">II")  # header length, CRC-32
_HEAD: Final = len(_MAGIC) + _PREFIX.size
_DIGEST_LENGTH: Final = 64  # a file's name: the hex sha256 of its key
_BOOT_ID: Final = "/proc/sys/kernel/random/boot_id"
# A file's remaining time may exceed its keep by the rounding of two float sums.
_CLOCK_SLACK: Final = 1e-3

_boot: list[str | None] = []  # read once per process: the boot id does not change


def boot_id() -> str | None:
    """This boot's id (Linux), or None when it cannot be read: then nothing is persisted,
    since a monotonic reading of another boot cannot be told from one of this boot."""
    if not _boot:
        try:
            with open(_BOOT_ID, "rb") as f:
                raw = f.read(128).strip()
            _boot.append(raw.decode("ascii") if raw else None)
        except (OSError, UnicodeDecodeError):
            _boot.append(None)
    return _boot[0]


@dataclass(frozen=True, slots=True)
class Record:
    """One kept outcome read back from its file."""

    key: str
    token: int
    outcome: wire.Value | wire.Failure
    expires: float  # time.monotonic() when it goes
    at: float  # time.monotonic() when it was kept


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def encode(record: Record, boot: str) -> bytes:
    """The bytes of ``record``'s file (see the module's docstring)."""
    fields, payload = wire.outcome_fields(record.outcome)
    header = {
        "key": record.key,
        "token": record.token,
        "boot": boot,
        "expires": record.expires,
        "at": record.at,
        **fields,
    }
    head = ENCODER.encode(header).encode("ascii")
    body = head + (payload or b"")
    return _MAGIC + _PREFIX.pack(len(head), zlib.crc32(body)) + body


class _Bad(Exception):
    """A file that is not a kept outcome this process may serve; its message says why."""


def decode(data: bytes, name: str, boot: str, now: float, max_payload: int) -> Record:
    """The record in ``data``, the contents of the file ``name``; raises _Bad when it
    is not whole, not its name's, of another boot, expired or not believable."""
    if len(data) < _HEAD or not data.startswith(_MAGIC):
        raise _Bad("it is not a kept outcome's file (or it was cut short)")
    length, crc = _PREFIX.unpack_from(data, len(_MAGIC))
    body = data[_HEAD:]
    if length > len(body):
        raise _Bad("it was cut short")
    if len(body) - length > max_payload:
        raise _Bad("its payload is over the bound it was kept under")
    if zlib.crc32(body) != crc:
        raise _Bad("its checksum does not match (cut short or damaged)")
    try:
        header = _json(body[:length])
    except (ValueError, RecursionError):
        raise _Bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise _Bad("its header is not a JSON object")
    key = header.get("key")
    if not isinstance(key, str) or not key or _digest(key) != name:
        raise _Bad("it is not the file of the key it names")
    token = header.get("token")
    if type(token) is not int or not 0 < token < fs.TOKEN_LIMIT:
        raise _Bad("its token is not a token")
    if header.get("boot") != boot:
        raise _Bad("it was kept in another boot")
    expires, at = header.get("expires"), header.get("at")
    if type(expires) is not float or type(at) is not float:
        raise _Bad("its times are not readings of the clock")
    if not (math.isfinite(expires) and math.isfinite(at)):
        raise _Bad("its times are not readings of the clock")
    payload = body[length:] if header.get("outcome") == "value" else None
    if payload is None and len(body) > length:
        raise _Bad("a failure with a payload")
    try:
        outcome = wire.parse_outcome(header, payload)
    except wire.BadRequest as exc:
        raise _Bad(f"its outcome is not one ({exc.message})") from None
    if not isinstance(outcome, (wire.Value, wire.Failure)) or outcome.keep is None:
        raise _Bad("its outcome is not a kept one")
    left = expires - now
    if left <= 0:
        raise _Bad("its time ran out")
    if left > outcome.keep + _CLOCK_SLACK or at > now:
        raise _Bad("its times are not of this clock")
    return Record(key, token, outcome, expires, at)


class KeptFiles:
    """``state/kept/`` of one directory, as one coordinator's term writes and reads it.

    Where the boot cannot be told, nothing is written or read. Every failure to write or
    remove is logged, never raised: the outcome is still kept in memory for this term; a
    failed write removes the key's older file, so a later term never serves an outcome
    older than one this term served."""

    __slots__ = ("_boot", "_folder", "_written")

    def __init__(self, directory: str) -> None:
        self._folder = os.path.join(directory, fs.STATE, KEPT)
        self._boot = boot_id()
        # The keys with a file (written in this term, or loaded): removing one of any
        # other key is a set lookup, no system call.
        self._written: set[str] = set()

    def write(self, record: Record) -> None:
        """Write ``record``'s file, replacing the key's older one atomically."""
        if self._boot is None:
            return
        path = os.path.join(self._folder, _digest(record.key))
        data = encode(record, self._boot)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            try:
                fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self._folder, 0o700)
                fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, path)  # a reader sees the older file or this one, whole
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            log.warning(
                "cannot write a kept outcome to %s (%s): the next coordinator will not serve it",
                self._folder,
                exc.strerror or exc,
            )
            self._written.add(record.key)
            self.remove(record.key)  # an older outcome of the key must not outlive this one
            return
        self._written.add(record.key)

    def remove(self, key: str, *, always: bool = False) -> None:
        """``key``'s outcome left the store: its file goes, if this term knows one (a set
        lookup otherwise); ``always``: whatever file the key has."""
        if key not in self._written and not (always and self._boot is not None):
            return
        self._written.discard(key)
        try:
            os.unlink(os.path.join(self._folder, _digest(key)))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning(
                "cannot remove a kept outcome from %s (%s): the next coordinator may "
                "serve it until its time runs out",
                self._folder,
                exc.strerror or exc,
            )

    def load(self, max_payload: int) -> list[Record]:
        """(At the start of a term) the kept outcomes of the terms before, oldest kept
        first. Every other file of ours goes: expired, damaged, of another boot, and the
        temp files of a write a crash cut short. A payload over ``max_payload`` (or over
        the ``max_bytes`` it was kept under) is not read."""
        if self._boot is None:
            return []
        try:
            entries = list(os.scandir(self._folder))
        except OSError:
            return []
        records: list[Record] = []
        now = time.monotonic()
        for entry in entries:
            name = entry.name
            if name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            if len(name) != _DIGEST_LENGTH:
                continue  # not ours
            try:
                record = self._read(entry.path, name, now, max_payload)
            except _Bad as exc:
                log.warning("dropped the kept outcome %s: %s", entry.path, exc)
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            except OSError as exc:
                # Not served in this term: it must not be served in a later one either
                # (this term's own landings of the key would not remove it).
                log.warning("cannot read the kept outcome %s (%s)", entry.path, exc.strerror or exc)
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            except Exception as exc:  # a damage the checks did not foresee: still not served
                log.warning(
                    "dropped the kept outcome %s: it broke the reader (%s)",
                    entry.path,
                    type(exc).__qualname__,
                )
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            if record is not None:
                records.append(record)
                self._written.add(record.key)
        records.sort(key=lambda r: r.at)
        return records

    def clear(self) -> None:
        """Remove every kept outcome's file (a term that could not load them serves
        none, and must not leave them to a later one)."""
        self._written.clear()
        try:
            names = os.listdir(self._folder)
        except OSError:
            return
        for name in names:
            if len(name) == _DIGEST_LENGTH or name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self._folder, name))

    def _read(self, path: str, name: str, now: float, max_payload: int) -> Record | None:
        # O_NONBLOCK: a FIFO put in a file's place must not block the new term's start.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None  # not ours
            head = os.pread(fd, _HEAD, 0)
            if len(head) < _HEAD or not head.startswith(_MAGIC):
                raise _Bad("it is not a kept outcome's file (or it was cut short)")
            length = _PREFIX.unpack_from(head, len(_MAGIC))[0]
            if _HEAD + length > info.st_size:
                raise _Bad("it was cut short")
            # Read the header first: its max_bytes says how large a payload may be.
            limit = _limit(os.pread(fd, length, _HEAD), max_payload)
            if info.st_size - _HEAD - length > limit:
                raise _Bad("its payload is over the bound it was kept under")
            data = _read_all(fd, info.st_size)
        finally:
            os.close(fd)
        return decode(data, name, self._boot or "", now, limit)


def _json(data: bytes) -> Any:
    """The JSON ``data`` holds (ValueError when none; RecursionError when too deep)."""
    return json.loads(data.decode("ascii"))


def _limit(head: bytes, max_payload: int) -> int:
    """The largest payload a file whose header is ``head`` may have: its own
    ``max_bytes`` when it names one, else ``max_payload``."""
    try:
        header: Any = _json(head)
    except (ValueError, RecursionError):
        raise _Bad("its header is not JSON") from None
    bound = header.get("max_bytes") if isinstance(header, dict) else None
    return bound if type(bound) is int and 0 < bound < fs.TOKEN_LIMIT else max_payload


def _read_all(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break  # shorter than it was: the CRC tells
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
