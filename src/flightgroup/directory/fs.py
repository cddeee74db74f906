"""The directory scope's files: where they are, the local-file-system check, durable
writes, the forgotten marks and the files of threads left past a deadline (the epoch
that numbers the coordinator's terms is :mod:`.epochs`'s).

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

Nothing here takes a lock: the forgotten marks are written only by the coordinator of
the term (the holder of ``flight.lock``), a file of left threads only by its own group.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
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
    "TOKEN_LIMIT",
    "check_local",
    "durable_write",
    "ensure_directory",
    "file_system_of",
    "forgotten_mark",
    "key_lock_path",
    "left_threads_path",
    "make_directory",
    "mark_forgotten",
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

TOKEN_LIMIT: Final = 2**63  # a token is ``epoch << 32 | sequence`` and fits 63 bits
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


def make_directory(path: str) -> None:
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
        make_directory(directory)
    make_directory(os.path.join(path, KEY_LOCKS))
    make_directory(os.path.join(path, STATE))


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
