"""Fleet groups in one test process: the arranges the fleet tests share."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from collections.abc import Callable, Coroutine
from typing import Any
from unittest import mock

from flightgroup import (
    JSON,
    FlightGroup,
    Retry,
)
from flightgroup.redis.arbiter import RedisArbiter
from flightgroup.redis.readers import LoopClients

from .support import in_thread, scope_of, wait_until, work_until


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


async def join_once(leader: FlightGroup, joiner: FlightGroup) -> None:
    """``joiner`` joins one flight that ``leader`` leads, from the running loop: that
    loop's first join reads on the group's thread, its next ones on the loop itself
    (ADR 0058)."""
    key = f"first-join-{uuid.uuid4().hex}"
    started, joined = threading.Event(), threading.Event()
    lead, led = in_thread(leader.run_sync, key, work_until(started, joined, "first"))
    assert await asyncio.to_thread(started.wait, 10)
    got = await joiner.run(key, never_runs, on_join=joined.set)
    await asyncio.to_thread(lead.join, 10)
    assert got.joined and got.value == result_of(led).value == "first"


def in_a_loop_that_joined(
    leader: FlightGroup, joiner: FlightGroup, make: Callable[[], Coroutine[Any, Any, Any]]
) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``make()``'s coroutine in a thread of its own, on an event loop that has
    joined once before (``join_once``), so that a join it makes reads on that loop; the
    thread and its ``in_thread`` result, once that first join is over. The result is an
    AssertionError if the first join read on the loop, or ``make()``'s did not."""
    readers = fleet_of(joiner)._readers
    asked: list[asyncio.AbstractEventLoop] = []  # the loops that asked for a client
    client = LoopClients.client

    async def counted(self: LoopClients, loop: asyncio.AbstractEventLoop) -> Any:
        if self is readers:
            asked.append(loop)
        return await client(self, loop)

    first_over = threading.Event()

    def body() -> Any:
        with asyncio.Runner() as runner, mock.patch.object(LoopClients, "client", counted):
            runner.run(join_once(leader, joiner))
            assert asked == [], "a loop's first join read on the loop"
            first_over.set()
            try:
                return runner.run(make())
            finally:
                loop = runner.get_loop()
                assert asked and all(one is loop for one in asked), "it read elsewhere"

    thread, out = in_thread(body)
    wait_until(lambda: first_over.is_set() or "error" in out, "the loop's first join")
    assert first_over.is_set(), repr(out.get("error"))
    return thread, out
