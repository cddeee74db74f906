"""What the fleet scope calls things in Redis, and for how long it keeps them: the keys
of one flightgroup key's flights (:class:`Names`), the TTLs the scripts are given, and
the server a Redis URL names (:func:`server_of`).

Every key of one flight shares one hash tag, so each script's keys are in one slot on a
Cluster; the namespace's fence and kept index are in a slot of their own, so on a
Cluster the fence is per key and no index is kept (ADR 0021).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Hashable
from typing import Any

__all__ = [
    "FENCE_TTL_MS",
    "FORGET_MEMORY_MS",
    "MAX_TTL_MS",
    "Names",
    "ms",
    "safe_url",
    "server_of",
]

FENCE_TTL_MS = 86_400_000  # the fence key lives a day past its last use
FORGET_MEMORY_MS = 60_000  # a FORGET's nonce key: past every re-send of that FORGET
# The longest TTL given to Redis (about 31,700 years). Past PEXPIRE's range, a script
# fails after its HSET (a Lua script has no rollback): a running record, or a mailbox,
# without a TTL, which every later caller of the key would join for ever.
MAX_TTL_MS = 10**15


class Names:
    """The Redis key names of one flightgroup key."""

    __slots__ = ("fence", "kept", "record")

    def __init__(self, namespace: str, key: str, cluster: bool) -> None:
        digest = hashlib.sha256(key.encode(errors="surrogatepass")).hexdigest()
        self.record = f"fg:{{{namespace}:{digest}}}"
        self.fence = f"{self.record}:f" if cluster else f"fg:{{{namespace}}}:fence"
        # The namespace's index of kept outcomes (Retention's LRU bounds), which the
        # scripts that keep, serve or drop an outcome update in the same step. None on
        # a Cluster: it lives in another slot than the records, so only TTLs bound
        # kept outcomes there (ADR 0021).
        index = f"fg:{{{namespace}}}:kept"
        self.kept = [] if cluster else [index, f"{index}:x", f"{index}:b"]

    def parked(self, token: int) -> str:
        return f"{self.record}:x:{token}"

    def mailbox(self, token: int) -> str:
        return f"{self.record}:m:{token}"

    def notice(self, token: int) -> str:
        return f"{self.record}:n:{token}"

    def forgot(self, nonce: str) -> str:
        return f"{self.record}:g:{nonce}"


def ms(seconds: float) -> int:
    """A duration for PEXPIRE: at least 1 ms, at most MAX_TTL_MS (clamped before it
    is rounded: a finite lease or keep near the float maximum overflows in ms)."""
    return max(1, round(min(float(MAX_TTL_MS), seconds * 1000)))


# Names of this host's loopback interface that a Redis URL commonly uses for one server.
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def server_of(parts: dict[str, Any]) -> tuple[Hashable, ...]:
    """The server and database that a parsed Redis URL names, without network I/O: its
    socket's real path, or its host (one name for the loopback ones: ``localhost``,
    ``127.0.0.1`` and ``::1``; others as written, lowercased) and port, and the
    database. Groups of this process whose URLs name one server are one scope to I6
    (ADR 0006)."""
    db = int(parts.get("db") or 0)
    if "path" in parts:
        return ("unix", os.path.realpath(str(parts["path"])), db)
    host = str(parts.get("host") or "localhost").lower()
    return ("tcp", "loopback" if host in _LOOPBACK else host, int(parts.get("port") or 6379), db)


def safe_url(url: str) -> str:
    """A Redis URL as messages show it: without its user and password."""
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.rpartition("@")[2] if sep else url
