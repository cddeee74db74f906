"""Outcome delivery to a fleet flight's joiners: the mailbox is a level, read from its
start, so a landing made before a joiner's first read is never lost.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from flightgroup.redis import scripts
from flightgroup.redis.names import Names

from ..infleet import fleet_group, fleet_of, never_runs, result_of
from ..redisproc import RedisServer
from ..support import in_thread


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
