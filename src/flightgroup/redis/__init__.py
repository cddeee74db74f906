"""The fleet scope: every process on every host that names one Redis and namespace
shares flights, decided by atomic scripts, with leases and fencing tokens.

- ``scripts``: the Lua scripts (docs/fleet-protocol.md).
- ``arbiter``: the arbiter a group uses (the Scope): its calls and leads, closing, a fork.
- ``calls``, ``names``, ``outcomes``, ``clients``: what it keeps of a call and a lead,
  the keys and TTLs, an outcome as Redis holds it, the redis-py clients.
- ``acquire``, ``delivery``, ``renewal``, ``landing``, ``undo``, ``status``: the steps it
  runs on its loop: ACQUIRE, a joiner's wait for the outcome, a lead's lease, COMPLETE,
  undoing an unanswered ACQUIRE, the running flights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..scope.interface import Scope

__all__ = ["open_scope"]


def open_scope(
    url: str, namespace: str, *, lease: float, cluster: bool, max_value_bytes: int
) -> Scope:
    """The fleet scope of ``namespace`` on the Redis of ``url`` (its arguments checked
    by the group): no connection is made until its first call. Raises ImportError
    without redis-py (the ``redis`` extra)."""
    try:
        from .arbiter import RedisArbiter
    except ImportError as exc:
        raise ImportError(
            "the fleet scope needs redis-py: pip install 'flightgroup[redis]'"
        ) from exc
    return RedisArbiter(
        url, namespace, lease=lease, cluster=cluster, max_value_bytes=max_value_bytes
    )
