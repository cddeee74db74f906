"""Outcome delivery to a fleet flight's joiners: the mailbox is a level, read from its
start, so a landing made before a joiner's first read is never lost; a task's joiner
reads it on its own loop (ADR 0056) once that loop joined before (ADR 0058), on a
connection of that loop's that the loop's end or the group's close closes, and an error
no step expects ends the call unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import threading
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from flightgroup import FlightGroup, UnavailableError
from flightgroup.redis import scripts
from flightgroup.redis.names import Names
from flightgroup.redis.readers import LoopClients

from ..infleet import (
    fleet_group,
    fleet_of,
    in_a_loop_that_joined,
    join_once,
    never_runs,
    result_of,
)
from ..redisproc import RedisServer
from ..support import in_thread, wait_until, work_until


@pytest.mark.timeout(30)
def test_a_landing_before_the_joiners_first_read_is_not_lost(
    redis_server: RedisServer, namespace: str
) -> None:
    """A landing made before the joiner's first read is not lost.

    The joiner's ACQUIRE joined flight t; its XREAD is held (on its own client)
    until the leader's COMPLETE has been answered; then the real XREAD is sent and
    returns the outcome at once (no CHECK, no lost wake-up)."""
    key = f"level-{uuid.uuid4().hex}"
    client = redis_server.client()
    names = Names(namespace, key, False)
    a, b = fleet_group(redis_server.url, namespace), fleet_group(redis_server.url, namespace)
    started, want_read, landed = threading.Event(), threading.Event(), threading.Event()
    reads: list[Any] = []
    joiner_scripts: list[str] = []
    state_at_read: list[tuple[int, int]] = []
    try:
        a.run_sync("warm-up-a", lambda: 0)
        b.run_sync("warm-up-b", lambda: 0)  # b's blocking client exists from now on
        leader, joiner = fleet_of(a), fleet_of(b)
        leader_script, joiner_script = leader._script, joiner._script

        async def leader_scripts(name: str, keys: Any, args: Any) -> Any:
            reply = await leader_script(name, keys, args)
            if name == "complete":
                landed.set()  # Redis took the landing (and answered it)
            return reply

        async def counted(name: str, keys: Any, args: Any) -> Any:
            joiner_scripts.append(name)
            return await joiner_script(name, keys, args)

        blocking = joiner._blocking
        original_xread = blocking.xread

        async def xread(*args: Any, **kwargs: Any) -> Any:
            want_read.set()  # the joiner knows its token and is about to read
            assert await asyncio.to_thread(landed.wait, 10)
            stream = next(iter(args[0]))  # the joined token's mailbox (then its notice)
            state_at_read.append((client.exists(names.record), client.xlen(stream)))
            reply = await original_xread(*args, **kwargs)
            reads.append(reply)
            return reply

        leader._script = leader_scripts  # type: ignore[method-assign]
        joiner._script = counted  # type: ignore[method-assign]
        blocking.xread = xread

        def work() -> str:
            started.set()
            assert want_read.wait(10)  # the joiner joined: land only now
            return "landed first"

        lead, led = in_thread(a.run_sync, key, work)
        assert started.wait(10)
        got = b.run_sync(key, never_runs)
        lead.join(10)
    finally:
        landed.set()
        a.close()
        b.close()
    assert result_of(led).value == got.value == "landed first"
    assert got.joined and got.token == result_of(led).token
    # When the read went out, the flight's record was gone and its mailbox held the
    # outcome: only the level (reading from ID 0) could still deliver it.
    assert state_at_read == [(0, 1)]
    assert len(reads) == 1 and reads[0], reads
    assert joiner_scripts == ["acquire"]  # the read itself got it: no CHECK


@pytest.mark.timeout(20)
def test_the_xread_the_arbiter_sends_reads_a_mailbox_written_before_it(
    redis_server: RedisServer, namespace: str
) -> None:
    """The XREAD the arbiter sends reads a mailbox written before it, at once.

    The script level: join, land, and only then the XREAD the arbiter sends (from
    ID 0, COUNT 1, BLOCK): it returns the entry at once."""
    client = redis_server.client()
    run = {name: client.register_script(body) for name, body in scripts.SCRIPTS.items()}
    names = Names(namespace, "k", False)
    lead = run["acquire"](keys=[names.record, names.fence],
                          args=["n1", 10_000, 86_400_000, 0, 1, "h", "k"])
    join = run["acquire"](keys=[names.record, names.fence],
                          args=["n2", 10_000, 86_400_000, 0, 2, "h", "k"])
    assert int(lead[0]) == 1 and int(join[0]) == 2 and join[1] == lead[1]
    token = int(join[1])
    landed = run["complete"](keys=[names.record, names.parked(token), names.mailbox(token)],
                             args=[token, "ok", b"V", 0, 11_000, 1024])
    assert [int(x) for x in landed] == [1, 1]
    assert not client.exists(names.record)
    # The block is long: a reply that waited for it would fail the test's timeout.
    reply = client.xread({names.mailbox(token): b"0"}, count=1, block=15_000)
    assert reply and reply[0][1][0][1] == {b"c": b"ok", b"v": b"V"}


@contextlib.contextmanager
def _two_groups(
    url: str, namespace: str, *releasing: threading.Event
) -> Iterator[tuple[FlightGroup, FlightGroup]]:
    """Two groups of ``namespace``, each past its first call (its loop, its scripts);
    on the way out the works waiting on ``releasing`` are let go, then both close."""
    a, b = fleet_group(url, namespace), fleet_group(url, namespace)
    try:
        a.run_sync("warm-up-a", lambda: 0)
        b.run_sync("warm-up-b", lambda: 0)
        yield a, b
    finally:
        for event in releasing:
            event.set()
        a.close()
        b.close()


def _blocked(client: Any) -> int:
    return int(client.info("clients")["blocked_clients"])


def _held(group: Any) -> tuple[threading.Event, threading.Event]:
    """Hold ``group``'s own thread (a step posted to its loop that waits): (it is held,
    let it go)."""
    held, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        let_go.wait(20)

    assert fleet_of(group)._background.post(hold)
    return held, let_go


@pytest.mark.timeout(30)
def test_a_tasks_joiner_is_woken_on_its_own_loop_while_the_groups_thread_is_held(
    server: RedisServer, namespace: str
) -> None:
    """A task's joiner reads the outcome on its own loop (ADR 0056) once that loop has
    joined before (ADR 0058): its call returns the leader's value while its group's
    thread is held. A thread's joiner reads on the group's thread: it waits until that
    thread is let go."""
    client = server.client()
    with _two_groups(server.url, namespace) as (a, b):
        for joiner in ("task", "thread"):
            key = f"k-{joiner}"
            started, release = threading.Event(), threading.Event()
            lead, led = in_thread(a.run_sync, key, work_until(started, release, "v"))
            assert started.wait(10)
            if joiner == "task":
                join, got = in_a_loop_that_joined(a, b, functools.partial(b.run, key, never_runs))
            else:
                join, got = in_thread(b.run_sync, key, never_runs)
            wait_until(lambda: _blocked(client) == 1, "the joiner's read")
            held, let_go = _held(b)
            try:
                assert held.wait(10)
                release.set()
                lead.join(10)
                # (a thread's joiner cannot return while the thread that reads is held)
                join.join(10 if joiner == "task" else 0.3)
                assert join.is_alive() is (joiner == "thread")
            finally:
                release.set()
                let_go.set()
            join.join(10)
            assert result_of(got).value == result_of(led).value == "v"
            assert result_of(got).joined


def _readers(client: Any) -> int:
    """The server's connections whose last command was an XREAD (a joiner's)."""
    return sum(1 for c in client.client_list() if c.get("cmd") == "xread")


def _connections(client: Any) -> int:
    gc.collect()  # a client dropped but not yet collected still holds its connection
    return int(client.info("clients")["connected_clients"])


def _received(client: Any) -> int:
    """The connections the server accepted since it started."""
    return int(client.info("stats")["total_connections_received"])


@pytest.mark.timeout(40)
def test_a_loops_first_join_reads_on_the_groups_thread_and_its_next_share_one_connection(
    server: RedisServer, namespace: str
) -> None:
    """A loop's first join reads on the group's thread (ADR 0058): a loop per call
    (``asyncio.run`` per request) opens no connection of its own. From its second join
    on, the loop's joiners read on one connection of that loop's, kept while the loop
    runs and closed as ``asyncio.run`` ends."""
    client = server.client()
    with _two_groups(server.url, namespace) as (a, b):
        counts: list[int] = []

        async def joins(first: int, count: int) -> None:
            for i in range(first, first + count):
                started, joined = threading.Event(), threading.Event()
                lead, led = in_thread(a.run_sync, f"k{i}", work_until(started, joined, 7))
                assert await asyncio.to_thread(started.wait, 10)
                got = await b.run(f"k{i}", never_runs, on_join=joined.set)
                await asyncio.to_thread(lead.join, 10)
                assert got.value == result_of(led).value == 7 and got.joined
                counts.append(_connections(client))

        asyncio.run(joins(0, 1))  # the group's thread reads: its blocking connection
        base = _connections(client)
        accepted = _received(client)
        for first in (1, 2, 3):  # a loop per call: nothing more
            asyncio.run(joins(first, 1))
        assert _received(client) == accepted and _connections(client) == base
        counts.clear()
        asyncio.run(joins(4, 4))
        # the first on the group's thread, then one connection for the loop's reads
        assert counts == [base, base + 1, base + 1, base + 1]
        assert _received(client) == accepted + 1
        wait_until(lambda: _connections(client) == base, "the loop's connection to close")


@pytest.mark.timeout(40)
@pytest.mark.parametrize("join", ["the loop's first", "a later one"])
def test_a_loop_that_ends_while_its_joiner_reads_leaves_no_read_behind(
    server: RedisServer, namespace: str, join: str
) -> None:
    """An event loop that ends while its task's joiner reads, on the group's thread (the
    loop's first join) or on the loop: the call and the read end (its local flight ends
    interrupted, as its loop stopped), the read's connection closes, and the leader's
    flight lands for everyone else."""
    client = server.client()
    started, release = threading.Event(), threading.Event()
    with _two_groups(server.url, namespace, release) as (a, b):
        lead, led = in_thread(a.run_sync, "k", work_until(started, release, "v"))
        assert started.wait(10)
        base = 0

        async def leave_while_reading() -> None:
            nonlocal base
            if join == "a later one":
                await join_once(a, b)  # (its group's thread's connection stays)
            base = await asyncio.to_thread(_connections, client)
            asyncio.get_running_loop().create_task(b.run("k", never_runs))
            await asyncio.to_thread(wait_until, lambda: _blocked(client) == 1, "the read")
            # one connection more: the group's blocking client's first, or the loop's
            assert await asyncio.to_thread(_connections, client) == base + 1
            # returns: asyncio.run cancels the joiner's task and the flight's own

        asyncio.run(leave_while_reading())
        wait_until(lambda: _blocked(client) == 0, "the read to end")
        wait_until(lambda: _connections(client) == base, "the read's connection to close")
        release.set()
        lead.join(10)
        assert result_of(led).value == "v"
        assert b.run_sync("k", lambda: "again").value == "again"  # b goes on


@pytest.mark.timeout(30)
@pytest.mark.parametrize("joiner", ["thread", "task's first join", "task"])
def test_a_read_that_fails_as_no_step_expects_ends_the_joiner_as_unavailable(
    redis_server: RedisServer, namespace: str, joiner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error a joiner's read does not expect (not Redis's: a transport's TypeError)
    ends its call with UnavailableError, whether it read on the group's thread (a
    thread's call, a loop's first join) or on its own loop; the leader's flight is not
    touched."""
    started, release = threading.Event(), threading.Event()

    async def broken(*_: Any, **__: Any) -> Any:
        raise TypeError("a transport's bug")

    with _two_groups(redis_server.url, namespace, release) as (a, b):
        lead, led = in_thread(a.run_sync, "k", work_until(started, release, "v"))
        assert started.wait(10)

        async def join_broken() -> Any:
            monkeypatch.setattr(aioredis.Redis, "xread", broken)  # (only b reads)
            return await b.run("k", never_runs)

        if joiner == "thread":
            monkeypatch.setattr(aioredis.Redis, "xread", broken)
            thread, got = in_thread(b.run_sync, "k", never_runs)
        elif joiner == "task's first join":
            thread, got = in_thread(asyncio.run, join_broken())
        else:
            thread, got = in_a_loop_that_joined(a, b, join_broken)
        thread.join(10)
        assert isinstance(got.get("error"), UnavailableError), got
        assert isinstance(got["error"].__cause__, TypeError)
        release.set()
        lead.join(10)
        assert result_of(led).value == "v"


@pytest.mark.timeout(40)
@pytest.mark.parametrize("then", ["the loop runs again", "the loop ends"])
def test_a_group_closed_between_its_loops_runs_closes_their_connections(
    server: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture, then: str
) -> None:
    """A group closed while a loop that read for it is idle (an ``asyncio.Runner``
    between two runs): the loop closes that connection when it runs again, or as it
    ends, and asyncio logs no error (the sentinel is closed by the loop alone)."""
    client = server.client()
    runner = asyncio.Runner()
    with _two_groups(server.url, namespace) as (a, b), contextlib.closing(runner):
        runner.run(join_once(a, b))  # (the loop's next join reads on the loop)
        base = _connections(client)
        started, joined = threading.Event(), threading.Event()
        lead, led = in_thread(a.run_sync, "k", work_until(started, joined, 7))
        assert started.wait(10)
        got = runner.run(b.run("k", never_runs, on_join=joined.set))
        lead.join(10)
        assert got.value == result_of(led).value == 7 and got.joined
        assert _connections(client) == base + 1  # the runner's loop keeps its connection
        assert _readers(client) == 2  # it and the group's thread's, from the first join
        b.close()  # (its loop idle: the close waits for the loop to run again)
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            if then == "the loop runs again":
                runner.run(asyncio.to_thread(
                    wait_until, lambda: _readers(client) == 0, "the loop's connection to go"
                ))
            runner.close()
            wait_until(lambda: _readers(client) == 0, "the loop's connection to go")
        assert [r for r in caplog.records if r.name == "asyncio"] == []


def test_loops_are_noted_weakly_and_one_without_weak_references_reads_at_once() -> None:
    """``reads_on``: a loop's first join reads on the group's thread, its second on the
    loop; the group does not keep a loop alive by noting it; a loop that takes no weak
    reference (a C loop may not) reads on itself at once, as before ADR 0058."""
    clients = LoopClients(lambda: None)
    loop = asyncio.new_event_loop()
    try:
        assert clients.reads_on(loop) is False
        assert clients.reads_on(loop) is True
    finally:
        loop.close()
    noted = weakref.ref(loop)
    del loop
    gc.collect()
    assert noted() is None

    class NoWeakReferences:
        __slots__ = ()

    assert clients.reads_on(NoWeakReferences()) is True  # type: ignore[arg-type]
