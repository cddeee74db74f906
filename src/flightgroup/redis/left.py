"""A fleet group's threads left past a deadline, published for ``flightgroup status``.

Each group of each process with threads running sync works past their deadlines keeps
one string key, ``fg:{<namespace>}:left:<host>:<pid>:<n>``, holding a JSON object (pid,
host, left_threads, max_deadline_threads). It is written when the count changes and again
every ``REFRESH`` seconds while it is not 0, with a TTL of ``TTL_MS``, and deleted when
the count falls to 0 or the group closes: the key of a process that died goes within
the TTL. Status reads the keys with a bounded SCAN (never KEYS). ADR 0038.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any, Final

from .._log import log
from .status import _glob_escape

__all__ = ["REFRESH", "TTL_MS", "LeftThreads", "left_threads"]

TTL_MS: Final = 60_000
REFRESH: Final = 20.0


def _prefix(namespace: str) -> str:
    return f"fg:{{{namespace}}}:left:"


class LeftThreads:
    """(On the group's loop) one group's published count. ``client`` gives the group's
    Redis client (None if it could not be made)."""

    __slots__ = ("_changed", "_task", "bound", "client", "count", "host", "name", "pid")

    def __init__(
        self, namespace: str, *, host: str, pid: int, serial: int, client: Callable[[], Any]
    ) -> None:
        self.name = f"{_prefix(namespace)}{host}:{pid}:{serial}"
        self.host = host
        self.pid = pid
        self.client = client
        self.count = 0
        self.bound = 0
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def update(self, count: int, bound: int, spawn: Callable[..., asyncio.Task[None]]) -> None:
        """(On the loop) the count changed: publish it now (and go on refreshing it)."""
        self.count, self.bound = count, bound
        if self._changed is None:
            self._changed = asyncio.Event()
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = spawn(self._keep())

    async def _keep(self) -> None:
        changed = self._changed
        assert changed is not None
        while True:
            changed.clear()
            count, bound = self.count, self.bound
            client = self.client()
            try:
                if client is None:
                    pass
                elif count:
                    body = json.dumps(
                        {
                            "pid": self.pid,
                            "host": self.host,
                            "left_threads": count,
                            "max_deadline_threads": bound,
                        }
                    )
                    await client.set(self.name, body, px=TTL_MS)
                else:
                    await client.delete(self.name)
            except Exception as exc:  # (the next change or refresh says it again)
                log.debug("cannot publish the threads left past a deadline: %s", exc)
            if not count and not changed.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), REFRESH)

    async def drop(self) -> None:
        """(On the loop, as the group closes) stop refreshing and delete the key."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        client = self.client()
        if self.count and client is not None:
            with contextlib.suppress(Exception):
                await client.delete(self.name)
        self.count = 0


async def left_threads(client: Any, namespace: str, limit: int) -> list[dict[str, Any]]:
    """The published counts of ``namespace``'s processes (at most ``limit`` keys)."""
    prefix = _prefix(namespace)
    names: list[bytes] = []
    async for name in client.scan_iter(match=f"{_glob_escape(prefix)}*", count=1000):
        names.append(name)
        if len(names) >= limit:
            break
    if not names:
        return []
    bodies = await asyncio.gather(*(client.get(name) for name in names))
    found = []
    for body in bodies:
        if body is None:  # (expired since the scan)
            continue
        try:
            entry = json.loads(body)
            found.append(
                {
                    "pid": int(entry["pid"]),
                    "host": str(entry["host"]),
                    "left_threads": int(entry["left_threads"]),
                    "max_deadline_threads": int(entry["max_deadline_threads"]),
                }
            )
        except (ValueError, KeyError, TypeError):
            continue
    found.sort(key=lambda entry: (entry["host"], entry["pid"]))
    return found
