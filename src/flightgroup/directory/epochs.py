"""The epoch that numbers the coordinator's terms (ADR 0009): every token of a term is
``epoch << 32 | sequence``, so a new term's epoch, written durably before it serves
(two copies: ``flight.epoch`` and ``state/epoch``), puts every token it issues above
every earlier one. When both copies are lost, the epoch is recovered from the tokens the
key-lock files hold (:func:`key_lock_token`: each leader writes its own there).

Nothing here locks: ``next_epoch`` is called only by the winner of the election, which
holds ``flight.lock`` for as long as it writes the epoch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import stat
from typing import Final

from . import fs

__all__ = ["EpochError", "key_lock_token", "next_epoch", "read_epoch"]

log = logging.getLogger("flightgroup")

# Tokens are ``epoch << 32 | sequence`` and must fit 63 bits, so an epoch stays below 2**31.
_EPOCH_LIMIT: Final = 2**31
# An epoch or a token is at most 19 digits; a file longer than this is not one (and reading
# it whole is pointless). Also keeps int() far from its 4,300-digit conversion limit.
_MAX_NUMBER_FILE: Final = 4096
_DECIMAL = re.compile(rb"\s*([0-9]+)\s*")


class EpochError(RuntimeError):
    """The epoch of a directory cannot be told, or cannot grow any further."""


class _Number:
    """What one file says: ``value`` when it holds a decimal number, else ``found`` says
    what is wrong with it, as a predicate ("is empty"); ``missing`` when there is no file."""

    __slots__ = ("found", "missing", "path", "value")

    def __init__(
        self, path: str, value: int | None, found: str = "", missing: bool = False
    ) -> None:
        self.path = path
        self.value = value
        self.found = found
        self.missing = missing


def _read_number(path: str) -> _Number:
    # O_NONBLOCK: a FIFO (or a device) put in a file's place would block its open, under
    # the election lock, for ever. Anything but a regular file is not ours.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return _Number(path, None, "is missing", missing=True)
    except OSError as e:
        return _Number(path, None, f"cannot be read ({e.strerror or e})")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _Number(path, None, "is not a regular file")
        raw = os.read(fd, _MAX_NUMBER_FILE + 1)
    except OSError as e:
        return _Number(path, None, f"cannot be read ({e.strerror or e})")
    finally:
        os.close(fd)
    if not raw.strip():
        return _Number(path, None, "is empty")
    match = _DECIMAL.fullmatch(raw) if len(raw) <= _MAX_NUMBER_FILE else None
    if match is None:
        shown = raw[:40].decode("utf-8", "backslashreplace")
        more = "..." if len(raw) > 40 else ""
        return _Number(path, None, f"holds {shown!r}{more}, which is not a decimal number")
    return _Number(path, int(match.group(1)))


def key_lock_token(directory: str, key: str) -> int | None:
    """The last token written to ``key``'s lock file: the newest flight of the key that
    took the lock (each leader writes its token under it). None when there is none, or
    the file is unreadable or corrupt."""
    path = fs.key_lock_path(directory, key)
    token = _read_number(path).value
    # Read without the lock: a read torn by a leader's write under it can still be a
    # number; two reads that agree are not torn (a write between them changes nothing:
    # the leader's own check, under the lock, is the one that decides).
    if token is None or token >= fs.TOKEN_LIMIT or _read_number(path).value != token:
        return None
    return token


def _key_lock_epochs(directory: str) -> list[int]:
    """The epochs of the tokens recorded in the key-lock files; unreadable, empty and
    corrupt files are skipped (a leader may be between taking a lock and writing to it)."""
    epochs: list[int] = []
    try:
        entries = os.scandir(os.path.join(directory, fs.KEY_LOCKS))
    except OSError:
        return epochs
    with entries:
        for entry in entries:
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
            except OSError:
                continue
            token = _read_number(entry.path).value
            if token is not None and token < fs.TOKEN_LIMIT:
                epochs.append(token >> 32)
    return epochs


def _epoch_paths(directory: str) -> tuple[str, str]:
    return os.path.join(directory, fs.EPOCH_NAME), os.path.join(directory, fs.STATE, "epoch")


def _describe(copies: tuple[_Number, ...]) -> str:
    return "; ".join(f"{c.path!r} {c.found}" for c in copies)


def _last_epoch(directory: str) -> int:
    """The epoch of the last term (0: a fresh directory), from the highest valid copy,
    else recovered from the key-lock files' fencing tokens (each recovery is logged).
    Raises EpochError when it cannot be told (ADR 0009)."""
    first_path, second_path = _epoch_paths(directory)
    first, second = _read_number(first_path), _read_number(second_path)
    valid = [c.value for c in (first, second) if c.value is not None]
    if valid:
        last = max(valid)
        if len(valid) == 1:
            bad = second if first.value is not None else first
            log.warning(
                "the epoch copy %s %s; went on from the other copy (epoch %d) and rewrote it.",
                bad.path,
                bad.found,
                last,
            )
        elif second.value is not None and first.value is not None and second.value > first.value:
            # flight.epoch is written first, so it is never behind unless something
            # restored or edited it: the higher copy wins, since the epoch never goes down.
            log.warning(
                "%s holds epoch %d, behind %s (%d); went on from %d.",
                first_path,
                first.value,
                second_path,
                second.value,
                last,
            )
    else:
        epochs = _key_lock_epochs(directory)
        if epochs:
            last = max(epochs)
            log.warning(
                "no valid epoch copy in %s (%s); recovered epoch %d from the "
                "fencing tokens of %d key-lock file(s).",
                directory,
                _describe((first, second)),
                last,
                len(epochs),
            )
        elif first.missing and second.missing:
            last = 0  # a fresh directory: its first term is 1
        else:
            locks = os.path.join(directory, fs.KEY_LOCKS)
            raise EpochError(
                f"Cannot tell the epoch of the flight directory {directory!r}: "
                f"{_describe((first, second))}, and no key-lock file in {locks!r} holds a "
                "fencing token to recover it from. Starting over at 1 could reuse fencing "
                "tokens, so nothing was changed. To fix it, write the highest epoch known "
                "(the high 32 bits of the highest fencing token your storage has seen) "
                f"as decimal text to {first_path!r}, e.g. `echo 42 > {shlex.quote(first_path)}`."
            )
    return last


def next_epoch(directory: str) -> int:
    """Start a new term: the epoch after the last one, written durably to flight.epoch
    and then to state/epoch. Only the winner of the election calls it.

    The last epoch is the highest valid copy; when neither copy is valid, the highest
    epoch among the fencing tokens in the key-lock files; a fresh directory starts at 1.
    Raises EpochError when the epoch cannot be told, or when it would reach 2**31. The
    rules, and why, are in docs/adr/0009-epoch-recovery.md.
    """
    first_path, second_path = _epoch_paths(directory)
    last = _last_epoch(directory)
    if last >= _EPOCH_LIMIT - 1:
        raise EpochError(
            f"The epoch of the flight directory {directory!r} is {last}, the highest there "
            "is (fencing tokens are epoch << 32 | sequence and must fit 63 bits), so no "
            "new term can start. If that number was written by mistake, write the right "
            f"epoch to {first_path!r} and {second_path!r}; otherwise move the group to a new "
            "directory, and reset the fencing tokens your storage remembers."
        )
    epoch = last + 1
    # state/ may have been removed by hand; the second copy is worth recreating it for.
    # Both temp files are made there: docs/api.md keeps the top level to the named files.
    state = os.path.dirname(second_path)
    fs.make_directory(state)
    _remove_stale_temp_files(state)
    fs.durable_write(first_path, f"{epoch}\n", temp_directory=state)
    fs.durable_write(second_path, f"{epoch}\n")
    return epoch


def _remove_stale_temp_files(state: str) -> None:
    """Remove the temp files a crash in the middle of an epoch write left in ``state``.
    Only the election's winner writes there, so none of them is being written now."""
    try:
        names = os.listdir(state)
    except OSError:
        return
    for name in names:
        if name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(state, name))


def read_epoch(directory: str) -> int | None:
    """The epoch in flight.epoch as it is now; None when the file is missing or corrupt."""
    return _read_number(_epoch_paths(directory)[0]).value
