"""What the commands' options name: the scope of a group (``--dir``, or ``--redis`` and
``--namespace``; else the default folder, which must be the user's own), the group it
opens, and ``--timeout``. Bad usage is a :class:`UsageError`: exit 2 with one line.
"""

from __future__ import annotations

import math
import os
import stat
import tempfile
from dataclasses import dataclass

from .codec import JSON
from .directory import fs
from .group import FlightGroup

__all__ = [
    "Scope",
    "UsageError",
    "default_directory",
    "open_group",
    "parse_timeout",
    "scope_from_args",
]


class UsageError(Exception):
    """Bad usage: the command exits 2 with this one line."""


@dataclass(frozen=True)
class Scope:
    """Where the group lives: a directory, or a Redis URL and a namespace."""

    directory: str | None = None
    redis: str | None = None
    namespace: str | None = None
    default: bool = False  # the directory is the default one (not named by --dir)


def default_directory() -> str:
    """``$XDG_RUNTIME_DIR/flightgroup``, else ``flightgroup-<uid>`` in the temp dir."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "flightgroup")
    return os.path.join(tempfile.gettempdir(), f"flightgroup-{os.getuid()}")


def scope_from_args(directory: str | None, redis: str | None, namespace: str | None) -> Scope:
    """Check the scope options of ``run`` and ``status``; UsageError if they clash."""
    if redis is not None:
        if directory is not None:
            raise UsageError("--dir and --redis exclude each other: choose one scope")
        if not namespace:
            raise UsageError("--redis needs --namespace NS (a non-empty namespace)")
        return Scope(redis=redis, namespace=namespace)
    if namespace is not None:
        raise UsageError("--namespace belongs to --redis")
    if directory is not None:
        if not directory:
            raise UsageError("--dir must not be empty")
        # Absolute: the value names the spool for joiners that run in other folders.
        return Scope(directory=os.path.abspath(directory))
    return Scope(directory=default_directory(), default=True)


def _check_default_folder(path: str, create: bool) -> bool:
    """Make the default folder 0700 if asked; refuse one that another user could
    have planted (the temp dir is shared). False if it does not exist."""
    if create:
        try:
            os.makedirs(path, mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise UsageError(f"cannot create the default folder {path}: {exc.strerror}") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise UsageError(
            f"the default directory {path} is not a folder of yours that only you can "
            "write; remove it or pass --dir"
        )
    return True


def open_group(scope: Scope, *, create: bool = True) -> FlightGroup | None:
    """The group of ``scope``; None for a default directory that does not exist and
    ``create`` is false (``status`` creates nothing). Raises UsageError."""
    try:
        if scope.redis is not None:
            return FlightGroup(redis=scope.redis, namespace=scope.namespace, codec=JSON)
        assert scope.directory is not None
        if scope.default and not _check_default_folder(scope.directory, create):
            return None
        if not create and os.path.exists(scope.directory):
            if not os.path.isdir(scope.directory):
                raise UsageError(f"cannot use the directory {scope.directory}: not a directory")
            fs.check_local(scope.directory)  # a network file system: bad usage, as for run
        if not create and not os.path.exists(os.path.join(scope.directory, fs.LOCK_NAME)):
            # No group ever used it (or it is no directory): nothing to ask, and a
            # status must not leave a group's files in any folder it is pointed at.
            return None
        # The group checks the path (its socket's length) and creates nothing: bad
        # usage changes nothing on disk.
        group = FlightGroup(directory=scope.directory, codec=JSON)
        if create:
            # A path that cannot be a directory group (a file, /proc, no permission)
            # is bad usage: one line, exit 2, not the first call's traceback.
            try:
                fs.ensure_directory(scope.directory)
            except OSError as exc:
                group.close()
                cause = exc.__cause__
                reason = (
                    fs.why_not_created(scope.directory, cause)[1]
                    if isinstance(cause, OSError)
                    else exc.strerror or str(exc)
                )
                raise UsageError(f"cannot use the directory {scope.directory}: {reason}") from None
        return group
    except NotImplementedError:
        raise UsageError("the fleet scope is not available in this version") from None
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None


def parse_timeout(text: str | None) -> float | None:
    """``--timeout``: positive, finite seconds."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {text!r}")
    return seconds
