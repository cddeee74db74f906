"""What a FlightGroup's arguments make: every check of them, in one place, and the
scope they name.

Construction checks its arguments and does no I/O (docs/api.md): a scope's machinery starts
at its first call. Each wide scope's package opens its own scope (``open_scope``), so a
new scope is one package and one line in :func:`configure`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .codec import Codec, check_codec
from .engine.workers import MAX_DEADLINE_THREADS
from .policy import (
    NO_POLICY,
    FlightPolicy,
    Limits,
    OnUnavailable,
    Retention,
    Retry,
    check_on_unavailable,
    check_seconds,
    check_takeover,
)

if TYPE_CHECKING:
    from .scope.interface import Scope

__all__ = [
    "MAX_FRAME", "Configuration", "OperationSettings", "check_call", "check_key",
    "check_operation", "check_policies", "configure",
]

SOCKET_PATH_LIMIT = 103  # bytes of UTF-8; macOS allows 104 with the NUL, Linux 108
DIRECTORY_MAX_VALUE = 64 * 1024 * 1024
# A landing's frame holds the value and a small header: the value leaves it this much room.
FRAME_HEADROOM = 64 * 1024
MAX_FRAME = DIRECTORY_MAX_VALUE + FRAME_HEADROOM  # max_frame_bytes' default
FLEET_MAX_VALUE = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Configuration:
    """A group's checked settings: its policy (NO_POLICY when every default holds),
    codec, the bound on an encoded outcome, and its wide scope (None: the process
    scope) with the text a warning names the group by."""

    policy: FlightPolicy
    deadline: float | None
    codec: Codec | None
    max_value_bytes: int | None
    scope: Scope | None
    named: str
    max_deadline_threads: int = MAX_DEADLINE_THREADS


def configure(
    *,
    directory: str | os.PathLike[str] | None,
    redis: str | None,
    namespace: str | None,
    codec: Codec | None,
    deadline: float | None,
    retry: Retry | None,
    retention: Retention | None,
    limits: Limits | None,
    on_unavailable: OnUnavailable,
    takeover: int,
    max_value_bytes: int | None,
    lease: float,
    cluster: bool,
    reconnect_timeout: float,
    max_frame_bytes: int,
    max_deadline_threads: int = MAX_DEADLINE_THREADS,
) -> Configuration:
    """Check a FlightGroup's arguments (see its docstring and docs/api.md) and make its scope.
    Raises TypeError or ValueError for the first bad one; nothing is started."""
    if directory is not None and redis is not None:
        raise ValueError("directory and redis exclude each other: choose one scope")
    if codec is not None:
        check_codec(codec)
    if (directory is not None or redis is not None) and codec is None:
        raise TypeError(
            "a directory or fleet group needs a codec (for example codec=flightgroup.JSON)"
        )
    path = "" if directory is None else _directory_path(directory)
    if redis is not None:
        _check_fleet(redis, namespace)
    elif namespace is not None:
        raise ValueError("namespace belongs to the fleet scope (redis=...)")
    check_seconds("lease", lease, allow_none=False, allow_zero=False, allow_inf=False)
    if not isinstance(cluster, bool):
        raise TypeError("cluster must be a bool")
    check_seconds("reconnect_timeout", reconnect_timeout, allow_none=False)
    deadline = check_seconds("deadline", deadline, allow_zero=False, allow_inf=False)
    check_policies(retry=retry, retention=retention, limits=limits)
    fallback = check_on_unavailable(on_unavailable, allow_none=False) or "raise"
    takeovers = check_takeover(takeover, allow_none=False) or 0
    _check_bounds(max_value_bytes, max_frame_bytes, codec)
    if isinstance(max_deadline_threads, bool) or not isinstance(max_deadline_threads, int):
        raise TypeError("max_deadline_threads must be an int")
    if max_deadline_threads < 1:
        raise ValueError(f"max_deadline_threads must be at least 1, got {max_deadline_threads}")
    # An argument of another scope would be ignored: say so rather than let a
    # misconfigured group run (a lease meant for Redis on a directory group).
    other: list[tuple[str, object, object, str]] = []
    if redis is None:
        fleet = "fleet scope (redis=...)"
        other += [("lease", lease, 10.0, fleet), ("cluster", cluster, False, fleet)]
    if directory is None:
        local = "directory scope (directory=...)"
        other += [
            ("reconnect_timeout", reconnect_timeout, 5.0, local),
            ("max_frame_bytes", max_frame_bytes, MAX_FRAME, local),
        ]
    for arg, value, default, owner in other:
        if value != default:
            raise ValueError(f"{arg} belongs to the {owner}")
    policy = FlightPolicy(deadline, retry, retention, limits, fallback, takeovers, codec)
    scope: Scope | None = None
    named = "FlightGroup()"
    if redis is not None:
        assert namespace is not None
        from .redis import open_scope as open_fleet

        if max_value_bytes is None:
            max_value_bytes = FLEET_MAX_VALUE
        scope = open_fleet(
            redis, namespace, lease=lease, cluster=cluster, max_value_bytes=max_value_bytes
        )
        named = f"FlightGroup(redis=..., namespace={namespace!r})"
    elif directory is not None:
        from .directory import open_scope as open_directory

        max_value_bytes = _directory_max_value(max_value_bytes, max_frame_bytes)
        scope = open_directory(
            path, max_frame=max_frame_bytes, reconnect_timeout=reconnect_timeout
        )
        named = f"FlightGroup(directory={path!r})"
    return Configuration(
        policy=NO_POLICY if policy == NO_POLICY else policy,
        deadline=deadline,
        codec=codec,
        max_value_bytes=max_value_bytes,
        scope=scope,
        named=named,
        max_deadline_threads=max_deadline_threads,
    )


def _directory_path(directory: str | os.PathLike[str]) -> str:
    """The directory scope's path, refused when empty or when its socket's path would
    pass the limit of a Unix socket's address."""
    path = os.fsdecode(os.fspath(directory))
    if not path:
        raise ValueError("directory must not be empty")
    sock = os.path.join(os.path.abspath(path), "flight.sock")
    size = len(sock.encode())
    if size > SOCKET_PATH_LIMIT:
        raise ValueError(
            f"the socket path {sock!r} is {size} bytes, over the limit of "
            f"{SOCKET_PATH_LIMIT}; choose a shorter directory"
        )
    return path


def _check_fleet(redis: object, namespace: object) -> None:
    """Refuse a fleet scope's URL or namespace."""
    if not isinstance(redis, str) or not redis.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("redis must be a redis://, rediss:// or unix:// URL")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError("the fleet scope needs a non-empty namespace")
    if "}" in namespace:
        # It would end the hash tag of the flight's Redis keys early, and split them
        # over a Cluster's slots.
        raise ValueError("a namespace cannot hold '}'")


def _check_bounds(max_value_bytes: object, max_frame_bytes: object, codec: Codec | None) -> None:
    """Refuse a bad ``max_value_bytes`` or ``max_frame_bytes``."""
    if max_value_bytes is not None:
        if isinstance(max_value_bytes, bool) or not isinstance(max_value_bytes, int):
            raise TypeError("max_value_bytes must be an int")
        if max_value_bytes < 1:
            raise ValueError("max_value_bytes must be a positive int")
        if codec is None:  # (a wide scope without one was refused before)
            # It bounds an encoded outcome: without a codec nothing is encoded.
            raise ValueError("max_value_bytes needs a codec in the process scope")
    if isinstance(max_frame_bytes, bool) or not isinstance(max_frame_bytes, int):
        raise TypeError("max_frame_bytes must be an int")
    if max_frame_bytes < 1024:
        raise ValueError("max_frame_bytes must be at least 1024")


def _directory_max_value(max_value_bytes: int | None, max_frame_bytes: int) -> int:
    """The directory scope's bound on an encoded outcome: a value must fit in a frame,
    or its landing would be refused by every coordinator (the connection dropped, the
    landing sent again, for ever)."""
    room = max_frame_bytes - min(FRAME_HEADROOM, max_frame_bytes // 2)
    if max_value_bytes is None:
        return min(DIRECTORY_MAX_VALUE, room)
    if max_value_bytes > room:
        raise ValueError(
            f"max_value_bytes ({max_value_bytes}) must leave room for a frame's "
            f"header in max_frame_bytes ({max_frame_bytes}): at most {room}"
        )
    return max_value_bytes


@dataclass(frozen=True, slots=True)
class OperationSettings:
    """A decorated operation's own settings (``coalesce()``'s), checked; each one None
    leaves the group's."""

    deadline: float | None
    retry: Retry | None
    retention: Retention | None
    limits: Limits | None
    on_unavailable: OnUnavailable | None
    takeover: int | None
    codec: Codec | None

    def over(self, policy: FlightPolicy) -> FlightPolicy:
        """``policy`` (a group's) with these settings in place of its own."""
        return policy.override(
            self.deadline, self.retry, self.retention, self.limits, self.on_unavailable,
            self.takeover, self.codec,
        )


def check_operation(
    *,
    key: object,
    name: object,
    deadline: float | None,
    retry: Retry | None,
    retention: Retention | None,
    limits: Limits | None,
    on_unavailable: OnUnavailable | None,
    takeover: int | None,
    codec: Codec | None,
) -> OperationSettings:
    """``coalesce()``'s arguments (a group's or a slot's), checked: TypeError or
    ValueError for a bad one, before anything is decorated."""
    if key is not None and not callable(key):
        raise TypeError("key must be a callable that returns the call's key")
    if name is not None and (not isinstance(name, str) or not name or "\x00" in name):
        raise ValueError("name must be a non-empty str without NUL characters")
    check_seconds("deadline", deadline, allow_zero=False, allow_inf=False)
    check_policies(retry=retry, retention=retention, limits=limits)
    return OperationSettings(
        deadline, retry, retention, limits, check_on_unavailable(on_unavailable),
        check_takeover(takeover), None if codec is None else check_codec(codec),
    )


def check_policies(
    *, retry: Retry | None, retention: Retention | None, limits: Limits | None
) -> None:
    """Raise TypeError for a policy of the wrong type (a group's or an operation's)."""
    for name, given, kind in (
        ("retry", retry, Retry),
        ("retention", retention, Retention),
        ("limits", limits, Limits),
    ):
        if given is not None and not isinstance(given, kind):
            raise TypeError(f"{name} must be a {kind.__name__}, not {type(given).__name__}")


def check_key(key: object) -> str:
    """``key`` as a plain ``str``. A subclass's (a StrEnum member's) is copied to one:
    the engine tells a plain key from a decorated function's by ``type(tkey) is str``,
    and a wide scope sends the characters, not what the subclass's ``__str__`` says."""
    if type(key) is not str:
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        key = str.__str__(key)
    if not key:
        raise ValueError("key must not be empty")
    return key


def check_call(work: object, on_join: object, timeout: object, fresh: object) -> None:
    """Raise TypeError or ValueError for a call's bad ``work``, ``on_join``, ``timeout``
    or ``fresh``."""
    if not callable(work):
        raise TypeError(f"work must be callable, not {type(work).__name__}")
    if on_join is not None and not callable(on_join):
        raise TypeError(f"on_join must be callable or None, not {type(on_join).__name__}")
    if timeout is not None:
        check_seconds("timeout", timeout)
    if type(fresh) is not bool:
        raise TypeError(f"fresh must be a bool, not {type(fresh).__name__}")
