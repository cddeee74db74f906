"""Fleet groups in one test process: the arranges the fleet tests share."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from typing import Any

from flightgroup import (
    JSON,
    FlightGroup,
    Retry,
)
from flightgroup.redis.arbiter import RedisArbiter

from .support import scope_of


def fleet_group(url: str, namespace: str, **options: Any) -> FlightGroup:
    return FlightGroup(redis=url, namespace=namespace, codec=JSON, **options)


def fleet_of(group: FlightGroup) -> RedisArbiter:
    """The group's fleet arbiter (its private steps are what tests patch)."""
    arbiter = scope_of(group)
    assert isinstance(arbiter, RedisArbiter)
    return arbiter


def never() -> Any:
    raise AssertionError("a joiner's work never runs")


def record_key(namespace: str, key: str) -> str:
    """The Redis key of ``key``'s flight record in ``namespace``."""
    return f"fg:{{{namespace}:{hashlib.sha256(key.encode()).hexdigest()}}}"


def in_thread_box(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread; its result or exception lands in the list."""
    box: list[Any] = []

    def body() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, box


RETRY_NOW = Retry(attempts=2, backoff=0.0, jitter=False)  # one retry, at once


def hold_script(
    arbiter: RedisArbiter,
    name: str,
    *,
    ran: threading.Event,
    release: threading.Event,
    replies: list[Any] | None = None,
    after: Callable[[Any], bool] = lambda reply: True,
) -> None:
    """Patch ``arbiter`` so that script ``name`` runs in Redis, then its reply is held
    (``ran`` is set) until ``release`` is set: the client has not heard it yet."""
    original = arbiter._script

    async def script(which: str, keys: Any, args: Any) -> Any:
        reply = await original(which, keys, args)
        if which == name:
            if replies is not None:
                replies.append(reply)
            if after(reply):
                ran.set()
                await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        return reply

    arbiter._script = script  # type: ignore[method-assign]


def never_sync() -> Any:
    """A joiner's work: it never runs."""
    raise AssertionError("a joiner's work never runs")


def result_of(out: dict[str, Any]) -> Any:
    """The result an ``in_thread`` call left in ``out`` (the test fails on its error)."""
    assert "error" not in out, repr(out.get("error"))
    return out["result"]


def never_runs(*_: Any) -> Any:
    """A work no caller may run, whatever it is given."""
    raise AssertionError("this caller must not run the work")


def hold_next_reply(
    arbiter: RedisArbiter,
    name: str,
    ran: threading.Event,
    release: threading.Event,
    heard: Callable[[], None] | None = None,
) -> None:
    """Patch ``arbiter`` so that the next script ``name`` runs in Redis and its reply
    is held (``ran`` set) until ``release``; ``heard()`` runs as the reply is handed on."""
    original = arbiter._script
    armed = [True]

    async def script(which: str, keys: Any, args: Any) -> Any:
        reply = await original(which, keys, args)
        if which == name and armed[0]:
            armed[0] = False
            ran.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
            if heard is not None:
                heard()
        return reply

    arbiter._script = script  # type: ignore[method-assign]

