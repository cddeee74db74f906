"""The redis-py clients of a fleet group, and what their errors mean.

A group makes two on its own loop (:func:`make_client`): one for scripts and commands,
whose socket timeout follows the lease, and one for the joiners' blocking XREADs, whose
socket timeout exceeds the longest block and which never re-sends. :func:`startup`
loads the scripts and warns when the server may evict the library's keys. Every step
treats :data:`UNREACHABLE` as "Redis is out of reach now" and tries again until its
own limit, :data:`RETRY_PAUSE` apart.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from .._log import log
from . import scripts

__all__ = [
    "COMMAND_TIMEOUT",
    "MAX_BLOCK",
    "RETRY_PAUSE",
    "UNREACHABLE",
    "command_timeout",
    "make_client",
    "startup",
]

# The command client's socket timeout: a quarter of the lease, within these bounds.
# redis-py tries a command 4 times (3 retries), so a server that takes connections but
# does not answer (frozen, SIGSTOP) fails a call in about a lease, not in 4 x 5 s
# whatever the lease.
COMMAND_TIMEOUT = 5.0  # the most (redis-py's default)
_MIN_COMMAND_TIMEOUT = 1.0  # the least: a busy server is not "out of reach"
MAX_BLOCK = 30.0  # one XREAD blocks at most this long (then reads again)
RETRY_PAUSE = 0.05  # between tries of a step that cannot reach Redis yet
# Connections per client (per node on a Cluster): no limit of the client's own. Each
# waited key holds one blocked connection (ADR 0011), and redis-py's bounded pool
# raises MaxConnectionsError at once when full (no wait, no retry): the server's
# maxclients is the bound that matters.
_MAX_CONNECTIONS = 2**31
# What a step treats as "Redis is out of reach now": it tries again until its own
# limit. (A Cluster client's errors are not RedisErrors.)
UNREACHABLE = (RedisError, RedisClusterException, OSError)


def command_timeout(lease: float) -> float:
    """The command client's socket timeout for a group of ``lease`` seconds."""
    return min(COMMAND_TIMEOUT, max(_MIN_COMMAND_TIMEOUT, lease / 4))


def make_client(
    url: str, *, cluster: bool, socket_timeout: float, connect_timeout: float, retries: int
) -> Any:
    """A client (Redis, or RedisCluster) of ``url``; ``retries``: how many times
    redis-py sends a command again after a connection error (0: never re-sent)."""
    retry = (
        Retry(ExponentialWithJitterBackoff(base=0.02, cap=0.5), retries)
        if retries
        else Retry(NoBackoff(), 0)
    )
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": retry,
        "max_connections": _MAX_CONNECTIONS,
    }
    if cluster:
        return RedisCluster.from_url(url, **options)
    return aioredis.Redis.from_url(url, **options)


async def startup(client: Any, blocking: Any, *, cluster: bool, where: str) -> None:
    """Load the scripts (a call then needs no NOSCRIPT round trips) and warn when the
    server may evict the library's keys. Best effort: a call reports its own errors."""
    try:
        if cluster:
            # Discover the nodes now: the first commands of a Cluster client that run
            # at once race its discovery, which closes connections under them
            # (redis-py 8.1: a TypeError from the transport, not a RedisError).
            await client.initialize()
            await blocking.initialize()
        else:
            async with client.pipeline(transaction=False) as pipe:
                for body in scripts.SCRIPTS.values():
                    pipe.script_load(body)
                await pipe.execute()
        policy = await client.config_get("maxmemory-policy")
    except (RedisError, RedisClusterException):
        return
    value = policy.get(b"maxmemory-policy") or policy.get("maxmemory-policy")
    if isinstance(value, bytes):
        value = value.decode()
    if value and value != "noeviction":
        log.warning(
            "Redis at %s has maxmemory-policy %s: it may evict flightgroup's keys "
            "(an evicted flight acts like a lost lease); use noeviction or a "
            "database of its own", where, value,
        )
