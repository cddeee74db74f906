"""close() of a fleet group: it hands over the landings already made before it returns (the
second close() too, a landing still in flight or posted as it closes), gives back a lead
it is answered as it closes, interrupts the joiners elsewhere of a flight it abandons at
once, ends a joiner's blocked read, leaves no connection nor thread behind, and a
forget() that races it raises GroupClosedError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
from typing import Any

import pytest
import redis

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
    GroupClosedError,
    UnavailableError,
    current_lease,
)
from flightgroup.redis.names import Names
from flightgroup.redis.readers import LoopClients

from ..infleet import (
    RETRY_NOW,
    fleet_group,
    fleet_of,
    hold_next_reply,
    hold_script,
    in_a_loop_that_joined,
    in_thread_box,
    never,
    never_sync,
)
from ..redisproc import RedisServer
from ..support import in_thread, outcome, wait_until

pytestmark = pytest.mark.timeout(40)


def _record(server: Any, namespace: str, key: str) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(server.url)
    try:
        found: dict[bytes, bytes] = client.hgetall(Names(namespace, key, False).record)
        return found
    finally:
        client.close()


def test_closing_during_a_retrys_attempt_interrupts_the_joiners_elsewhere_at_once(
    redis_server: Any, namespace: str
) -> None:
    """Closing during a retry's ATTEMPT interrupts the joiners elsewhere at once.

    close() abandons the flight under the token the ATTEMPT that Redis already ran moved it to,
    so the joiners elsewhere, following `next`, never wait a whole lease."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30,
                    retry=RETRY_NOW)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    ran, release = threading.Event(), threading.Event()
    fleet = fleet_of(a)
    hold_script(fleet, "attempt", ran=ran, release=release)
    abandoned = threading.Event()
    original_abandon = fleet._abandon

    async def abandon(lead: Any, reason: str) -> None:
        await original_abandon(lead, reason)
        abandoned.set()

    fleet._abandon = abandon  # type: ignore[method-assign]
    joined, fail = threading.Event(), threading.Event()
    calls = 0

    def work() -> str:
        nonlocal calls
        calls += 1
        fail.wait(20)
        raise ValueError(f"attempt {calls}")

    leader, _ = in_thread_box(lambda: a.run_sync("k", work))
    try:
        wait_until(lambda: calls == 1, "the lead")
        there, there_box = in_thread_box(lambda: b.run_sync("k", never_sync, on_join=joined.set))
        assert joined.wait(10)
        fail.set()
        assert ran.wait(10)  # Redis moved the flight to a new token; the leader waits
        closing, _ = in_thread_box(a.close)
        assert abandoned.wait(10)
        release.set()
        closing.join(20)
        there.join(10)
        assert not there.is_alive(), "the joiner elsewhere waits for the lease"
        assert isinstance(there_box[0], FlightInterruptedError)
        assert _record(redis_server, namespace, "k").get(b"s") != b"R"
    finally:
        fail.set()
        release.set()
        a.close()
        b.close()
        leader.join(10)


def test_closing_during_an_acquire_that_leads_gives_the_lead_back(
    redis_server: Any, namespace: str
) -> None:
    """Closing during an ACQUIRE that leads gives the lead back.

    An ACQUIRE answered "lead" after close() began: close() waits for the abandon it starts, so
    the record goes and the joiners elsewhere never wait a whole lease."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    fleet = fleet_of(a)
    ran, release = threading.Event(), threading.Event()
    hold_script(fleet, "acquire", ran=ran, release=release)
    original_close = fleet._close

    async def close() -> None:
        release.set()  # the held ACQUIRE is heard once close() has begun
        await original_close()

    fleet._close = close  # type: ignore[method-assign]
    joined = threading.Event()
    caller, _ = in_thread_box(lambda: a.run_sync("k", lambda: "never runs"))
    try:
        assert ran.wait(10)
        there, there_box = in_thread_box(lambda: b.run_sync("k", never_sync, on_join=joined.set))
        assert joined.wait(10)
        a.close()
        assert _record(redis_server, namespace, "k").get(b"s") != b"R"
        there.join(10)
        assert not there.is_alive(), "the joiner elsewhere waits for the lease"
        assert isinstance(there_box[0], FlightInterruptedError)
    finally:
        release.set()
        a.close()
        b.close()
        caller.join(10)


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_a_forget_posted_as_the_loop_shuts_down_does_not_wait_out_its_timeout(
    redis_server: RedisServer, namespace: str
) -> None:
    """A forget() posted as the loop shuts down raises GroupClosedError at once.

    forget() passes its ``_closing`` check; close() then runs to the point where the group's loop
    has stopped and its thread is about to close it; only then does the forget post its FORGET.
    It raises GroupClosedError (or returns, as forget on a closed group does), never waits out
    its timeout to raise UnavailableError."""
    g = fleet_group(redis_server.url, namespace, lease=1.0)  # forget's own bound: 5 s
    g.run_sync("warm-up", lambda: 0)
    fleet = fleet_of(g)
    loop = fleet._background.loop
    assert loop is not None
    in_forget, loop_closing, posted = threading.Event(), threading.Event(), threading.Event()
    forget_thread: list[int] = []
    real_ensure = fleet._ensure_started
    real_close, real_post = loop.close, loop.call_soon_threadsafe

    def ensure_started() -> asyncio.AbstractEventLoop:
        started = real_ensure()
        forget_thread.append(threading.get_ident())
        in_forget.set()  # past forget()'s check of _closing
        loop_closing.wait(10)
        return started

    def close_loop() -> None:  # on the group's thread: the loop stopped, not closed
        loop_closing.set()
        posted.wait(10)
        real_close()

    def call_soon_threadsafe(callback: Any, *args: Any, **kwargs: Any) -> Any:
        handle = real_post(callback, *args, **kwargs)
        if forget_thread and threading.get_ident() == forget_thread[0]:
            posted.set()  # the FORGET is queued on the stopped loop
        return handle

    fleet._ensure_started = ensure_started  # type: ignore[method-assign]
    loop.close = close_loop  # type: ignore[method-assign]
    loop.call_soon_threadsafe = call_soon_threadsafe  # type: ignore[method-assign]
    forgetting, out = in_thread(g.forget, "k")
    closing: threading.Thread | None = None
    try:
        assert in_forget.wait(10)
        closing, _ = in_thread(g.close)
        forgetting.join(20)
    finally:
        loop_closing.set()
        posted.set()
        forgetting.join(20)
        if closing is not None:
            closing.join(20)
    ended = outcome(out)
    assert not isinstance(ended, UnavailableError), (
        f"forget() waited out its timeout on a closed group's dropped FORGET: {ended!r}"
    )
    assert ended is None or isinstance(ended, GroupClosedError), repr(ended)


@pytest.mark.timeout(60)
def test_close_with_a_lease_past_timeout_max_hands_over_the_landing(
    redis_server: RedisServer, namespace: str
) -> None:
    """close() with a lease past threading.TIMEOUT_MAX still hands over the landing.

    The leader's work returned; its COMPLETE is about to be sent (held on a gate) when close()
    runs. close() hands the landing over (API: "close() returns once the landings already made
    have been handed over") with lease=1e10 s too (finite, accepted, past threading.TIMEOUT_MAX
    ~9.2e9 s); the gate opens once close() returned, or after it waited a second."""
    a = fleet_group(redis_server.url, namespace, lease=1e10)
    b = fleet_group(redis_server.url, namespace, lease=1.0)
    fleet = fleet_of(a)
    a.run_sync("warm-up", lambda: 0)
    started, joined = threading.Event(), threading.Event()
    completing, gate = threading.Event(), threading.Event()
    original = fleet._script

    async def script(which: str, keys: Any, args: Any) -> Any:
        if which == "complete":
            completing.set()
            await asyncio.get_running_loop().run_in_executor(None, gate.wait, 20)
        return await original(which, keys, args)

    fleet._script = script  # type: ignore[method-assign]

    def work() -> str:
        started.set()
        assert joined.wait(10)
        return "v"

    lead, _ = in_thread(a.run_sync, "k", work)
    join: threading.Thread | None = None
    closing: threading.Thread | None = None
    try:
        assert started.wait(10)
        join, got = in_thread(b.run_sync, "k", never, on_join=joined.set, timeout=8)
        assert completing.wait(10)  # the work returned; land() posted the landing
        closing, _ = in_thread(a.close)
        closing.join(1.0)  # it waits for the landing (returning at once would be wrong)
        gate.set()
        closing.join(20)
        join.join(15)
    finally:
        joined.set()
        gate.set()
        lead.join(15)
        if join is not None:
            join.join(15)
        if closing is not None:
            closing.join(20)
        b.close()
    result = outcome(got)
    assert not isinstance(result, TimeoutError), "the landing made before close() was dropped"
    assert result.value == "v" and result.joined


@pytest.mark.timeout(60)
def test_a_second_close_returns_only_once_the_first_handed_the_landing_over(
    redis_server: RedisServer, namespace: str
) -> None:
    """A second close() returns only once the first handed the landing over.

    docs/api.md: "close() returns once the landings already made have been handed over": a second
    close() (another thread, or ``with`` after an explicit close) waits while the first still
    hands a landing over."""
    a = fleet_group(redis_server.url, namespace, lease=5.0)
    fleet = fleet_of(a)
    a.run_sync("warm-up", lambda: 0)
    completing, gate, completed = threading.Event(), threading.Event(), threading.Event()
    original = fleet._script

    async def script(which: str, keys: Any, args: Any) -> Any:
        if which != "complete":
            return await original(which, keys, args)
        completing.set()
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 20)
        try:
            return await original(which, keys, args)
        finally:
            completed.set()

    fleet._script = script  # type: ignore[method-assign]
    waiting = threading.Event()

    class Watched(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waiting.set()  # the second close() waits for the first one
            return super().wait(timeout)

    fleet._close_returned = Watched()  # type: ignore[misc]
    first: threading.Thread | None = None
    second: threading.Thread | None = None
    # The leader's call returns once its landing was handed over: it waits in a thread.
    # (Called here, it would wait the gate's 20 s out and hand the landing over before
    # any close(), and the second close() would be seen waiting only by luck.)
    leader, led = in_thread(a.run_sync, "k", lambda: "v")
    try:
        assert completing.wait(10)  # the landing is made, its COMPLETE held
        first, _ = in_thread(a.close)
        wait_until(lambda: fleet._closing, "the first close began")

        def second_close() -> bool:
            a.close()
            return completed.is_set()  # what was handed over when it returned

        second, handed = in_thread(second_close)
        assert waiting.wait(10)
        assert second.is_alive()  # it waits while the landing is held
        gate.set()
        second.join(20)
        first.join(20)
        assert outcome(handed) is True
        leader.join(20)
        # docs/api.md: a leader still waiting in a group that closes raises GroupClosedError
        # (its landing was handed over all the same).
        assert isinstance(outcome(led), GroupClosedError), led
    finally:
        gate.set()
        for thread in (leader, first, second):
            if thread is not None:
                thread.join(20)


def _fleet_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "flightgroup-fleet")


@pytest.mark.timeout(60)
def test_a_landing_made_before_close_is_handed_over(
    redis_server: RedisServer, namespace: str
) -> None:
    """A landing made just before close() is handed over.

    The leader's work ended and ``land()`` marked the lead done; the thread is preempted before
    it posts the landing to the group's loop, and ``close()`` runs then. close() hands that
    landing over (or interrupts it for the joiners) before it returns."""
    a = fleet_group(redis_server.url, namespace, lease=30)
    fleet = fleet_of(a)
    a.run_sync("warm-up", lambda: 0)
    posting, release, closed = threading.Event(), threading.Event(), threading.Event()
    post_task, close_steps = fleet._background.post_task, fleet._close

    def paused_post_task(coro: Any) -> bool:
        if getattr(coro, "__name__", "") == "_land":
            posting.set()  # the lead is marked done; the landing is not posted yet
            release.wait(10)
        return post_task(coro)

    async def watched_close() -> None:
        await close_steps()
        closed.set()

    fleet._background.post_task = paused_post_task  # type: ignore[method-assign]
    fleet._close = watched_close  # type: ignore[method-assign]
    names = Names(namespace, "k", False)
    client = redis_server.client()
    tokens: list[int] = []

    def work() -> str:
        tokens.append(current_lease().token)
        return "v"

    thread, led = in_thread(a.run_sync, "k", work)
    try:
        assert posting.wait(10)
        closing, _ = in_thread(a.close)
        # Bounded: close() may wait for the post (it cannot end first).
        closed.wait(1)
        release.set()
        closing.join(20)
        thread.join(10)
    finally:
        release.set()
        a.close()
    assert isinstance(outcome(led), GroupClosedError)  # closed while it waited (API)
    (token,) = tokens
    state = client.hget(names.record, "s")
    entry = client.xrange(names.mailbox(token))
    # Handed over: the mailbox holds the value, or at least the joiners were told.
    assert entry, f"nothing landed; the record is still {state!r} for a lease"
    assert state != b"R"


@pytest.mark.timeout(60)
def test_a_forget_racing_close_raises_no_cancelled_error(
    redis_server: RedisServer, namespace: str
) -> None:
    """A forget() racing close() raises no CancelledError."""
    a = fleet_group(redis_server.url, namespace)
    a.run_sync("warm-up", lambda: 0)
    ran, release = threading.Event(), threading.Event()
    hold_next_reply(fleet_of(a), "forget", ran, release)
    thread, out = in_thread(a.forget, "k")
    try:
        assert ran.wait(10)  # Redis ran it; its reply is not heard yet
        a.close()
    finally:
        release.set()
        thread.join(10)
    ended = outcome(out)
    assert not isinstance(ended, concurrent.futures.CancelledError)
    assert ended is None or isinstance(ended, GroupClosedError | UnavailableError), ended
    # The group's status() after close: GroupClosedError, not "Event loop is closed".
    with pytest.raises(GroupClosedError):
        fleet_of(a).status(timeout=5)


@pytest.mark.timeout(60)
def test_calls_and_closes_leave_no_connection_or_thread_behind(
    server: RedisServer, namespace: str
) -> None:
    """Calls and closes leave no connection nor thread behind."""
    client = server.client()

    def clients() -> int:
        gc.collect()  # a client dropped but not yet collected still holds its connection
        return int(client.info("clients")["connected_clients"])

    def blocked() -> int:
        return int(client.info("clients")["blocked_clients"])

    base, threads = clients(), _fleet_threads()
    for _ in range(3):
        g = fleet_group(server.url, namespace, lease=2)
        g.run_sync("k", lambda: 1)
        g.close()
    wait_until(lambda: clients() == base, "the closed groups' connections to go")
    assert _fleet_threads() == threads

    lead = fleet_group(server.url, namespace, lease=2)
    join = fleet_group(server.url, namespace, lease=2)
    started, release = threading.Event(), threading.Event()
    try:
        lead.run_sync("warm-up", lambda: 0)
        join.run_sync("warm-up", lambda: 0)
        steady = clients()
        for i in range(20):
            lead.run_sync(f"k{i}", lambda: 1)
        assert clients() == steady  # no connection per call

        def work() -> str:
            started.set()
            assert release.wait(10)
            return "v"

        thread, out = in_thread(lead.run_sync, "long", work)
        assert started.wait(10)
        for _ in range(5):
            with pytest.raises(TimeoutError):
                join.run_sync("long", never, timeout=0.05)

        async def cancelled() -> None:
            for _ in range(5):
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(join.run("long", asyncio.sleep), 0.05)

        asyncio.run(cancelled())
        assert blocked() <= 1  # one read for the key, whatever the callers that left
        release.set()
        thread.join(10)
        assert outcome(out).value == "v"
        wait_until(lambda: blocked() == 0, "the read to end with the landing")
    finally:
        release.set()
        lead.close()
        join.close()
    wait_until(lambda: clients() == base, "every connection to go")
    assert _fleet_threads() == threads


@pytest.mark.timeout(60)
def test_close_waits_for_a_landing_in_flight(redis_server: RedisServer, namespace: str) -> None:
    """close() waits for a landing in flight."""
    a = fleet_group(redis_server.url, namespace)
    b = fleet_group(redis_server.url, namespace)
    fleet = fleet_of(a)
    a.run_sync("warm-up", lambda: 0)
    order: list[str] = []
    ran, release, closing, joined = (threading.Event() for _ in range(4))
    hold_next_reply(fleet, "complete", ran, release, heard=lambda: order.append("landing heard"))
    close_steps = fleet._close

    async def watched_close() -> None:
        closing.set()
        await close_steps()

    fleet._close = watched_close  # type: ignore[method-assign]

    def work() -> str:
        assert joined.wait(10)
        return "v"

    thread, led = in_thread(a.run_sync, "k", work)
    try:
        join, got = in_thread(b.run_sync, "k", never, on_join=joined.set)
        assert ran.wait(10)  # COMPLETE ran in Redis, its reply is held
        closer, _ = in_thread(lambda: (a.close(), order.append("closed")))
        assert closing.wait(10)
        release.set()
        closer.join(20)
        thread.join(10)
        join.join(10)
    finally:
        release.set()
        a.close()
        b.close()
    assert order == ["landing heard", "closed"]
    assert outcome(got).value == "v" and outcome(got).joined
    assert isinstance(outcome(led), GroupClosedError)  # it still waited when closed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("joiner", ["thread", "task's first join", "task"])
def test_closing_a_joiners_group_ends_its_blocked_read(
    server: RedisServer, namespace: str, joiner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing a joiner's group ends its blocked read: on the group's thread (a thread's
    call, a loop's first join), or on the call's own loop (a task's), from another
    thread. A task's loop runs
    on after its call raised, and its client is left open here: only close()'s cancel of
    the read can end it."""
    monkeypatch.setattr(LoopClients, "close", lambda self: None)
    client = server.client()
    a = fleet_group(server.url, namespace, lease=30)
    b = fleet_group(server.url, namespace, lease=30)
    started, release, loop_may_end = threading.Event(), threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(10)
        return "v"

    async def join_then_run_on() -> Any:
        try:
            return await b.run("k", never)
        finally:  # (an ended loop would cancel the read itself)
            await asyncio.to_thread(loop_may_end.wait, 20)

    thread, led = in_thread(a.run_sync, "k", work)
    try:
        assert started.wait(10)
        if joiner == "thread":
            join, got = in_thread(b.run_sync, "k", never)
        elif joiner == "task's first join":
            join, got = in_thread(asyncio.run, join_then_run_on())
        else:
            join, got = in_a_loop_that_joined(a, b, join_then_run_on)
        wait_until(lambda: int(client.info("clients")["blocked_clients"]) == 1, "the read")
        b.close()
        wait_until(lambda: int(client.info("clients")["blocked_clients"]) == 0, "no read")
        loop_may_end.set()
        join.join(10)
        assert isinstance(outcome(got), GroupClosedError)
        release.set()
        thread.join(10)
    finally:
        release.set()
        loop_may_end.set()
        a.close()
        b.close()
    assert outcome(led).value == "v"
