"""The flights in progress in a fleet namespace, as ``status()`` lists them: found by a
bounded SCAN of the namespace's records (never KEYS), read with HMGET."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from ..scope.interface import key_as_called

__all__ = ["running_flights"]


async def running_flights(client: Any, namespace: str, limit: int) -> list[dict[str, Any]]:
    """The running flights of ``namespace`` (at most ``limit`` records looked at), by
    token: key, token, leader_pid, host, joiners, age_s."""
    prefix = f"fg:{{{namespace}:"
    pattern = f"{_glob_escape(prefix)}*"
    # The glob also matches a longer namespace ("app" finds "app:v2"): only a record
    # or a parked record of this one (the key's digest, then the tag's end).
    ours = re.compile(re.escape(prefix.encode()) + rb"[0-9a-f]{64}\}(?::x:[0-9]+)?\Z")
    names: list[bytes] = []
    async for name in client.scan_iter(match=pattern, count=1000):
        if ours.match(name):
            names.append(name)
            if len(names) >= limit:
                break
    if not names:
        return []
    now = await client.time()
    now_us = now[0] * 1_000_000 + now[1]
    records = await asyncio.gather(
        *(client.hmget(name, "k", "t", "s", "p", "h", "b", "j") for name in names)
    )
    flights = []
    for record in records:
        key, token, state, pid, host, began, joiners = record
        if state != b"R" or token is None:
            continue
        flights.append({
            "key": key_as_called(_key_text(key or b"")),
            "token": int(token),
            "leader_pid": int(pid or 0),
            "host": (host or b"").decode(errors="replace"),
            "joiners": int(joiners or 0),
            "age_s": round(max(0, now_us - int(began or now_us)) / 1e6, 3),
        })
    flights.sort(key=lambda flight: flight["token"])
    return flights


def _key_text(raw: bytes) -> str:
    """A key as the group was called with it: keys are written with surrogatepass (a
    command line's undecodable bytes), so read back the same way."""
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # not written by a group
        return raw.decode("utf-8", "replace")


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
