"""The directory scope's files: where they are, the local-file-system check, durable
writes, and the epoch that numbers the coordinator's terms.

Layout of a group's directory (docs/api.md, docs/directory-protocol.md)::

    flight.lock              the election (exclusive flock, held for a whole term)
    flight.epoch             the epoch of the last term, decimal text, written durably
    flight.sock              the coordinator's Unix socket
    execution-locks/<sha256> the key locks; each holds the last fencing token written to it
    state/epoch              a second durable copy of the epoch (ADR 0009)
    state/forgotten/<sha256> the last token of a key's flight a forget() detached (ADR 0020)
    state/left-threads/<pid>-<n> a group's threads running works past their deadlines,
                             while there are any (ADR 0038)
    state/kept/<sha256>      a key's kept outcome (Retention), :mod:`.keptfiles` (ADR 0039)

Nothing here locks: ``next_epoch`` is called only by the winner of the election, which
holds ``flight.lock`` for as long as it writes the epoch.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shlex
import stat
import sys
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from ..errors import NetworkDirectoryError

__all__ = [
    "EPOCH_NAME",
    "KEY_LOCKS",
    "LOCK_NAME",
    "NETWORK_FILE_SYSTEMS",
    "SOCKET_NAME",
    "STATE",
    "EpochError",
    "check_local",
    "durable_write",
    "ensure_directory",
    "file_system_of",
    "forgotten_mark",
    "key_lock_path",
    "left_threads_path",
    "mark_forgotten",
    "next_epoch",
    "read_epoch",
    "read_left_threads",
    "socket_path",
    "write_left_threads",
]

log = logging.getLogger("flightgroup")

LOCK_NAME: Final = "flight.lock"
EPOCH_NAME: Final = "flight.epoch"
SOCKET_NAME: Final = "flight.sock"
KEY_LOCKS: Final = "execution-locks"
STATE: Final = "state"  # state/epoch is the second copy of the epoch
_FORGOTTEN: Final = "forgotten"  # state/forgotten/<sha256 of the key>
_MARK_SIZE: Final = 64
_LEFT_THREADS: Final = "left-threads"  # state/left-threads/<pid>-<n>
_LEFT_SIZE: Final = 256

# Tokens are ``epoch << 32 | sequence`` and must fit 63 bits, so an epoch stays below 2**31.
_EPOCH_LIMIT: Final = 2**31
TOKEN_LIMIT: Final = 2**63
# An epoch or a token is at most 19 digits; a file longer than this is not one (and reading
# it whole is pointless). Also keeps int() far from its 4,300-digit conversion limit.
_MAX_NUMBER_FILE: Final = 4096
_DECIMAL = re.compile(rb"\s*([0-9]+)\s*")
_DIRECTORY_MODE: Final = 0o700

# Linux fstype names (the field after " - " in /proc/self/mountinfo) of the file systems
# where flock and Unix sockets do not reach across hosts. FUSE as such is not in it: most
# FUSE file systems are local, so only named network subtypes are.
NETWORK_FILE_SYSTEMS: Mapping[str, str] = MappingProxyType(
    {
        "nfs": "NFS",
        "nfs4": "NFSv4",
        "cifs": "CIFS/SMB",
        "smb3": "SMB3",
        "smbfs": "SMB",
        "ceph": "CephFS",
        "fuse.ceph-fuse": "CephFS (ceph-fuse)",
        "9p": "9P",
        "lustre": "Lustre",
        "glusterfs": "GlusterFS",
        "fuse.glusterfs": "GlusterFS",
        "afs": "AFS",
        "ocfs2": "OCFS2",
        "gfs2": "GFS2",
        "ncpfs": "NetWare (NCP)",
        "coda": "Coda",
        "gpfs": "IBM Spectrum Scale (GPFS)",
        "beegfs": "BeeGFS",
        "orangefs": "OrangeFS",
        "pvfs2": "OrangeFS (PVFS2)",
        "davfs": "WebDAV (davfs2)",
        "fuse.davfs": "WebDAV (davfs2)",
        "fuse.sshfs": "SSHFS",
        "fuse.s3fs": "s3fs (S3)",
        "fuse.goofys": "goofys (S3)",
        "fuse.gcsfuse": "gcsfuse (Google Cloud Storage)",
        "fuse.rclone": "rclone",
        "fuse.juicefs": "JuiceFS",
        "fuse.mfs": "MooseFS",
        "fuse.cvmfs2": "CernVM-FS",
        "fuse.blobfuse": "blobfuse (Azure)",
        "fuse.blobfuse2": "blobfuse2 (Azure)",
    }
)

# realpath -> True for directories found local. Unknown answers are never cached, so a
# later call (e.g. after /proc is mounted) can still find out.
_local_cache: dict[str, bool] = {}

_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")


class EpochError(RuntimeError):
    """The epoch of a directory cannot be told, or cannot grow any further."""


# --- the file system check --------------------------------------------------------------


def _unescape(field: bytes) -> bytes:
    # The kernel writes space, tab, newline and backslash in mount points as \040 \011 \012 \134.
    return _OCTAL_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field)


def _mounts(mountinfo: bytes) -> list[tuple[str, str]]:
    """(mount point, fstype) of each well-formed line, in the file's order."""
    mounts: list[tuple[str, str]] = []
    for line in mountinfo.splitlines():
        fields = line.split(b" ")
        # id parent major:minor root mount-point options [optional...] - fstype source super
        try:
            separator = fields.index(b"-", 6)
        except ValueError:
            continue
        if separator + 1 >= len(fields):
            continue
        point = os.fsdecode(_unescape(fields[4]))
        fstype = os.fsdecode(_unescape(fields[separator + 1]))
        if point.startswith("/") and fstype:
            mounts.append((point, fstype))
    return mounts


def _within(path: str, point: str) -> bool:
    # On component boundaries: "/mnt/a" holds "/mnt/a/x" but not "/mnt/ab".
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def file_system_of(path: str, mountinfo: str | None = None) -> str | None:
    """The fstype of the mount that holds ``path``, as /proc/self/mountinfo names it.

    A path that does not exist is judged by where it would be created (``os.path.realpath``
    resolves its existing part). ``mountinfo`` replaces the contents of
    /proc/self/mountinfo (for tests). Returns None when it cannot be told: not Linux, no
    /proc, or no mount holds the path.
    """
    if mountinfo is None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            with open("/proc/self/mountinfo", "rb") as f:
                raw = f.read()
        except OSError:
            return None
    else:
        raw = os.fsencode(mountinfo)
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for point, fstype in _mounts(raw):
        # ">=": a later line with the same mount point is mounted over the earlier one.
        if _within(target, point) and (best is None or len(point) >= best[0]):
            best = (len(point), fstype)
    return None if best is None else best[1]


def check_local(path: str, mountinfo: str | None = None) -> None:
    """Raise NetworkDirectoryError(path, name) when ``path`` is on a network file system.

    Kernel locks and Unix sockets do not work across hosts there. A file system that
    cannot be told counts as local. A local answer is cached per real path for the life
    of the process, but only for the real /proc/self/mountinfo (``mountinfo`` None).
    """
    real = os.path.realpath(path)
    if mountinfo is None and _local_cache.get(real):
        return
    fstype = file_system_of(real, mountinfo)
    if fstype is None:
        return
    name = NETWORK_FILE_SYSTEMS.get(fstype)
    if name is not None:
        raise NetworkDirectoryError(path, name)
    if mountinfo is None:
        _local_cache[real] = True


# --- directories and durable files ------------------------------------------------------


def _make_directory(path: str) -> None:
    """mkdir one directory with mode 0700; an existing directory is fine."""
    try:
        os.mkdir(path, _DIRECTORY_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return  # made by someone else (maybe a concurrent call): its mode is theirs
    # The umask may have removed bits, even the owner's; this one is ours, so set it exactly.
    os.chmod(path, _DIRECTORY_MODE)


def ensure_directory(path: str) -> None:
    """Create ``path`` (and each missing parent) with mode 0700, and its ``execution-locks``
    and ``state`` subfolders. The mode of a directory that exists is left alone.

    Idempotent and safe when several threads or processes do it at once. Raises an
    OSError (of the class its errno maps to) that names ``path`` and the reason: a
    component of it that is no directory (NotADirectoryError), no permission to create
    one (PermissionError), or the system's own reason.
    """
    try:
        _ensure_directory(path)
    except OSError as exc:
        raise cannot_create(path, exc) from exc


def cannot_create(path: str, exc: OSError) -> OSError:
    """The error of a group directory ``path`` that could not be made (``exc``: the
    error of one component of it), in words that name ``path`` and the reason."""
    number, reason = why_not_created(path, exc)
    return OSError(number, f"cannot create the group's directory {path!r}: {reason}")


def why_not_created(path: str, exc: OSError) -> tuple[int, str]:
    """The errno and the reason, in words, why making ``path`` failed with ``exc`` (about
    one component of it, ``exc.filename``)."""
    where = exc.filename if isinstance(exc.filename, str) else path
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        # mkdir of a component that exists but is no directory (EEXIST), or of one under
        # such a component (ENOTDIR): name the component that is in the way.
        blocker = where
        probe = os.path.abspath(where)
        while probe != os.path.dirname(probe):
            if os.path.lexists(probe) and not os.path.isdir(probe):
                blocker = probe
                break
            probe = os.path.dirname(probe)
        kind = "a file, not a directory" if os.path.isfile(blocker) else "not a directory"
        return errno.ENOTDIR, f"{blocker!r} is {kind}"
    if isinstance(exc, PermissionError):
        return exc.errno or errno.EACCES, f"no permission to create {where!r}"
    return exc.errno or errno.EIO, f"cannot create {where!r} ({exc.strerror or exc})"


def _ensure_directory(path: str) -> None:
    """``ensure_directory``, raising the OSError of the component that failed."""
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    # Top down, one at a time: os.makedirs gives its mode to the leaf only.
    for directory in reversed(missing):
        _make_directory(directory)
    _make_directory(os.path.join(path, KEY_LOCKS))
    _make_directory(os.path.join(path, STATE))


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some file systems cannot fsync a directory; the rename is as durable as they allow.
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def durable_write(path: str, text: str, temp_directory: str | None = None) -> None:
    """Replace the contents of ``path`` with ``text`` (UTF-8) so that a crash leaves either
    the old contents or the new, never a mix, and the new ones survive a power loss once
    this returns: a temp file, fsync, rename over ``path``, fsync of its directory.

    The temp file is made in ``temp_directory`` (on the same file system, so the rename
    stays atomic), by default beside ``path``. On an error it is removed and the error
    raised; ``path`` is unchanged. A crash can leave it behind: it ends in ``.tmp``.
    """
    data = text.encode("utf-8")
    folder = os.path.dirname(path) if temp_directory is None else temp_directory
    tmp = os.path.join(folder, f"{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_directory(os.path.dirname(path) or ".")
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # gone if it was renamed over path
            os.unlink(tmp)
        raise


# --- the epoch ---------------------------------------------------------------------------


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
    path = key_lock_path(directory, key)
    token = _read_number(path).value
    # Read without the lock: a read torn by a leader's write under it can still be a
    # number; two reads that agree are not torn (a write between them changes nothing:
    # the leader's own check, under the lock, is the one that decides).
    if token is None or token >= TOKEN_LIMIT or _read_number(path).value != token:
        return None
    return token


def _key_lock_epochs(directory: str) -> list[int]:
    """The epochs of the tokens recorded in the key-lock files; unreadable, empty and
    corrupt files are skipped (a leader may be between taking a lock and writing to it)."""
    epochs: list[int] = []
    try:
        entries = os.scandir(os.path.join(directory, KEY_LOCKS))
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
            if token is not None and token < TOKEN_LIMIT:
                epochs.append(token >> 32)
    return epochs


def _epoch_paths(directory: str) -> tuple[str, str]:
    return os.path.join(directory, EPOCH_NAME), os.path.join(directory, STATE, "epoch")


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
            locks = os.path.join(directory, KEY_LOCKS)
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
    _make_directory(state)
    _remove_stale_temp_files(state)
    durable_write(first_path, f"{epoch}\n", temp_directory=state)
    durable_write(second_path, f"{epoch}\n")
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


# --- paths -------------------------------------------------------------------------------


def key_lock_path(directory: str, key: str) -> str:
    """The key-lock file of ``key``: execution-locks/<hex sha256 of the key's UTF-8>.
    A lone surrogate is encoded as is (surrogatepass), so every str key has a file."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return os.path.join(directory, KEY_LOCKS, digest)


def socket_path(directory: str) -> str:
    """The absolute path of the coordinator's socket, flight.sock in ``directory``."""
    return os.path.join(os.path.abspath(directory), SOCKET_NAME)


# --- forgotten flights (ADR 0020) ---------------------------------------------------------


def _forgotten_path(directory: str, key: str) -> str:
    digest = os.path.basename(key_lock_path(directory, key))
    return os.path.join(directory, STATE, _FORGOTTEN, digest)


def mark_forgotten(directory: str, key: str, token: int) -> None:
    """Write down that the flight of ``key`` with ``token`` (and every earlier one)
    was forgotten, so that a later term knows it. Written before the forget is
    confirmed; a process's death does not undo a write (the page cache is the
    kernel's), so the next term reads it. Fixed-width decimal text: no truncate, the
    token only grows. A failure is logged, not raised."""
    path = _forgotten_path(directory, key)
    data = b"%-20d\n" % token
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.dirname(path), 0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning(
            "cannot write down a forget in %s (%s): a later coordinator may let "
            "calls join the forgotten flight", directory, exc.strerror or exc,
        )


def forgotten_mark(directory: str, key: str) -> int | None:
    """The last forgotten token of ``key`` (see mark_forgotten), or None."""
    try:
        fd = os.open(_forgotten_path(directory, key), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, _MARK_SIZE)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return int(raw.strip() or b"x")
    except ValueError:
        return None


# --- threads left past a deadline (ADR 0038) -----------------------------------------------


def left_threads_path(directory: str, name: str) -> str:
    """The file in which one group of one process says how many of its threads run
    works past their deadlines (``name``: the process id, a dash, the group's number)."""
    return os.path.join(directory, STATE, _LEFT_THREADS, name)


def write_left_threads(path: str, pid: int, left: int, bound: int) -> None:
    """Write ``left`` and ``bound`` of process ``pid`` to ``path`` (replaced whole, so a
    reader never sees half of it); at ``left`` 0 the file is removed. Raises OSError."""
    if not left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    body = b'{"pid": %d, "left_threads": %d, "max_deadline_threads": %d}\n' % (pid, left, bound)
    temp = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.dirname(path), 0o700)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)
    os.replace(temp, path)


def read_left_threads(directory: str) -> list[dict[str, int]]:
    """What every live process of the directory wrote with write_left_threads (a file of
    a process that is gone, or that does not parse, is skipped; nothing is changed)."""
    folder = os.path.join(directory, STATE, _LEFT_THREADS)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for name in names:
        if name.endswith(".tmp"):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as file:
                entry = json.loads(file.read(_LEFT_SIZE))
            pid = int(entry["pid"])
            counts = {
                "pid": pid,
                "left_threads": int(entry["left_threads"]),
                "max_deadline_threads": int(entry["max_deadline_threads"]),
            }
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid):
            found.append(counts)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's process: it exists)
        return True
    return True
