"""An adversarial review of the fleet scope (``FlightGroup(redis=URL, namespace=NS)``),
against real redis-servers started here (tests/redisproc.py) and the promises of
docs/fleet-protocol.md and API.md.

Bugs found, each fixed; each test below failed for that bug's reason on the code before
its fix (they were strict xfails until then):

- ``test_status_lists_only_the_flights_of_its_own_namespace``: ``status()`` of namespace
  "app" scans ``fg:{app:*`` and also lists the flights of namespace "app:v2".
- ``test_a_namespace_with_a_closing_brace_is_refused``: a namespace holding ``}`` ends
  the hash tag ``{ns:d}`` early; on a Cluster the keys of one flight landed in different
  slots and every call failed (CROSSSLOT). It is refused with ValueError.
- ``test_a_plain_key_never_shares_a_flight_with_a_decorated_function`` (fleet and
  directory): the wide key of a decorated function is ``name + "\\0" + key``; a plain
  key with that text joined the decorated function's flight and got its value (the
  process scope keeps them apart). A plain key holding a NUL now gets one more in front.
- ``test_a_lease_past_the_pexpire_range_leaves_no_record_without_a_ttl``: a finite lease
  past Redis's PEXPIRE range makes ACQUIRE stop after its HSET: a running record without
  a TTL, which every later caller (in any process) joins and polls with CHECK for ever.
- ``test_a_retention_past_the_pexpire_range_lands_for_the_leader_too``: same range in
  COMPLETE: the mailbox is written (no TTL), the joiners get the value, the leader gets
  LeaseLostError.
- ``test_a_landing_made_before_close_is_handed_over``: ``land()`` marks the work done and
  then posts the landing; a ``close()`` that runs in between neither abandons nor waits
  for it: the landing is dropped and the record stays running for a lease.
- ``test_a_resent_acquire_after_a_forget_leads_the_flight_its_joiner_joined``: an
  ACQUIRE that led, whose reply was lost, is re-sent after a FORGET parked its flight: the
  re-send leads a second flight, the parked one is never renewed nor landed, and its
  joiner gets FlightInterruptedError while its leader lives and lands.
- ``test_the_first_call_does_not_wait_for_the_startup_pipeline``: the first call of a
  group waited for the startup's SCRIPT LOAD pipeline (4 command timeouts on a frozen
  server) before its own ACQUIRE (4 more): twice the documented bound.
- ``test_a_forget_racing_close_raises_no_cancelled_error``: a ``forget()`` whose FORGET
  is in flight when ``close()`` stops the loop raises concurrent.futures.CancelledError.
- ``test_a_joiner_that_followed_a_retry_hears_its_leaders_death_within_the_leaders_lease``:
  after a retry's `next`, a joiner waits its own lease (not the flight's) before CHECK: a
  dead leader of lease 1 s is noticed by a joiner of lease 30 s only after 30 s.

Checked and found right (passing pins): no connection, blocked read or thread left per
call, per caller timeout/cancel or per close; a re-sent ATTEMPT (its reply cut by a proxy)
keeps the flight and its joiners; a leading caller's own timeout at ACQUIRE, ATTEMPT or
COMPLETE withdraws only that caller; ``close()`` waits for a COMPLETE in flight; closing a
joiner's group ends its blocked XREAD; keys and namespaces with braces and glob
characters (one flight, ``status()`` escapes its pattern; ``{`` on a Cluster).

Orders are forced with events, patched steps that pause on an event, proxies that cut or
hold replies, and SIGSTOP of a server the test started; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import hashlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
    GroupClosedError,
    LeaseLostError,
    Retention,
    Retry,
    UnavailableError,
    current_lease,
)
from flightgroup.redis.arbiter import RedisArbiter, _Names

from .infleet import fleet_group, fleet_of, never
from .infresh import held
from .redisproc import (
    CutProxy,
    HoldingCutProxy,
    RedisCluster,
    RedisServer,
    keys_without_ttl,
)
from .support import in_thread, outcome, wait_until

pytestmark = pytest.mark.timeout(60)

_RETRY_NOW = Retry(attempts=2, backoff=0.0, jitter=False)
_PAST_PEXPIRE = 1e17  # seconds: finite, accepted, and past Redis's PEXPIRE range (~9.2e15)


# -- helpers ---------------------------------------------------------------------------


def _hold(
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


def _fleet_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "flightgroup-fleet")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of the test's own (frozen, or left with keys the module's
    server must not hold)."""
    s = RedisServer()
    try:
        yield s
    finally:
        s.close()


# -- 1. status() scans another namespace's flights ------------------------------------


def test_status_lists_only_the_flights_of_its_own_namespace(
    redis_server: RedisServer, namespace: str
) -> None:
    mine = fleet_group(redis_server.url, namespace)
    other = fleet_group(redis_server.url, f"{namespace}:v2")
    started, release = threading.Event(), threading.Event()
    thread, out = in_thread(other.run_sync, "k", held([], "other", started, release))
    try:
        assert started.wait(10)
        assert fleet_of(other).status()  # it runs, in its own namespace
        assert fleet_of(mine).status() == []  # nothing runs in this one
    finally:
        release.set()
        thread.join(10)
        mine.close()
        other.close()
    assert outcome(out).value == "other"


# -- 2. a namespace that starts with "}" on a Cluster ---------------------------------


@pytest.mark.parametrize("bad", ["}x", "a}b", "x}"])
def test_a_namespace_with_a_closing_brace_is_refused(redis_server: RedisServer, bad: str) -> None:
    """A '}' in the namespace ends the hash tag ``{ns:digest}`` of a flight's keys
    early: on a Cluster they fell into different slots and every call failed with
    UnavailableError (CROSSSLOT). It is refused when the group is made, naming why."""
    with pytest.raises(ValueError, match="namespace cannot hold '}'"):
        fleet_group(redis_server.url, bad)


def test_a_namespace_with_an_opening_brace_and_glob_characters_works_on_a_cluster(
    cluster: RedisCluster,
) -> None:
    """Pin: "{", "*" and "[" in a namespace leave the hash tag whole (one slot per
    flight); two groups share one flight and status() finds it."""
    namespace = f"a{{b*[{uuid.uuid4().hex[:6]}"
    a, b = (fleet_group(cluster.url, namespace, cluster=True) for _ in range(2))
    started, joined = threading.Event(), threading.Event()
    lead, led = in_thread(a.run_sync, "k{1}", held([], "v", started, joined))
    try:
        assert started.wait(10)
        assert [f["key"] for f in fleet_of(b).status()] == ["k{1}"]
        got = b.run_sync("k{1}", never, on_join=joined.set)
        lead.join(10)
    finally:
        joined.set()
        a.close()
        b.close()
    assert got.value == outcome(led).value == "v"
    assert got.joined and got.token == outcome(led).token


# -- 3. a plain key and a decorated function's key ------------------------------------


@pytest.mark.parametrize("scope", ["fleet", "directory"])
@pytest.mark.parametrize("form", ["{op}\x00k", "\x00{op}\x00k"])
def test_a_plain_key_never_shares_a_flight_with_a_decorated_function(
    redis_server: RedisServer, namespace: str, directory: str, scope: str, form: str
) -> None:
    """Both wide scopes send a decorated function's key with its name and NULs (it
    was "name NUL key"; it is "NUL name NUL key"): a plain key of either text, called
    from another group, must lead a flight of its own, as it does in one process."""
    if scope == "fleet":
        a = fleet_group(redis_server.url, namespace)
        b = fleet_group(redis_server.url, namespace)
    else:
        a = FlightGroup(directory=directory, codec=JSON)
        b = FlightGroup(directory=directory, codec=JSON)
    op = f"op-{uuid.uuid4().hex[:8]}"
    started, gate, joined, plain_ran = (threading.Event() for _ in range(4))

    @a.coalesce(key=lambda x: x, name=op)
    def decorated(x: str) -> str:
        started.set()
        assert gate.wait(10)
        return "decorated"

    def plain() -> str:
        plain_ran.set()
        return "plain"

    dec_thread, dec = in_thread(decorated, "k")
    try:
        assert started.wait(10)
        thread, out = in_thread(b.run_sync, form.format(op=op), plain, on_join=joined.set)
        wait_until(lambda: joined.is_set() or plain_ran.is_set(), "the plain call's lead or join")
        gate.set()
        thread.join(10)
        dec_thread.join(10)
    finally:
        gate.set()
        a.close()
        b.close()
    assert outcome(dec) == "decorated"
    result = outcome(out)
    assert result.value == "plain", f"the plain call got {result!r}"
    assert not result.joined


# -- 4 and 5. durations past Redis's PEXPIRE range ------------------------------------


def test_a_lease_past_the_pexpire_range_leaves_no_record_without_a_ttl(
    server: RedisServer, namespace: str
) -> None:
    client = server.client()
    sane = fleet_group(server.url, namespace, lease=1.0)
    try:
        try:
            huge = fleet_group(server.url, namespace, lease=_PAST_PEXPIRE)
        except ValueError:
            huge = None  # refused at construction: fine
        if huge is not None:
            try:
                huge.run_sync("k", lambda: "huge")
            except UnavailableError:
                pass  # Redis refused the call: fine, if it left nothing behind
            finally:
                huge.close()
        left = keys_without_ttl(client, f"fg:{{{namespace}*")
        # A sane group of the namespace must not wait on a flight that nobody runs
        # (today: it joins the record and sends a CHECK every 50 ms until its timeout).
        try:
            later: Any = sane.run_sync("k", lambda: "sane", timeout=2.0)
        except TimeoutError as exc:
            later = exc
    finally:
        sane.close()
    assert left == [], "a running record without a TTL"
    assert not isinstance(later, TimeoutError), "a sane caller waits on it for ever"
    assert later.value == "sane" and not later.joined


def test_a_retention_past_the_pexpire_range_lands_for_the_leader_too(
    server: RedisServer, namespace: str
) -> None:
    try:
        leader = fleet_group(server.url, namespace, retention=Retention(success=_PAST_PEXPIRE))
    except ValueError:
        return  # refused at construction: fine
    joiner = fleet_group(server.url, namespace)
    started, joined = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert joined.wait(10)
        return "v"

    thread, led = in_thread(leader.run_sync, "k", work)
    try:
        assert started.wait(10)
        got = joiner.run_sync("k", never, on_join=joined.set)
        thread.join(10)
        left = keys_without_ttl(server.client(), f"fg:{{{namespace}*")
    finally:
        joined.set()
        leader.close()
        joiner.close()
    assert got.value == "v" and got.joined
    assert not isinstance(outcome(led), LeaseLostError), "the joiner got the value it landed"
    assert outcome(led).value == "v"
    assert left == []


# -- 6. close() and a landing being posted ---------------------------------------------


def test_a_landing_made_before_close_is_handed_over(
    redis_server: RedisServer, namespace: str
) -> None:
    """The leader's work ended and ``land()`` marked the lead done; the thread is
    preempted before it posts the landing to the group's loop, and ``close()`` runs
    then. close() must hand that landing over (or interrupt it for the joiners); it
    returns having done neither, and the landing's task never runs."""
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
    names = _Names(namespace, "k", False)
    client = redis_server.client()
    tokens: list[int] = []

    def work() -> str:
        tokens.append(current_lease().token)
        return "v"

    thread, led = in_thread(a.run_sync, "k", work)
    try:
        assert posting.wait(10)
        closing, _ = in_thread(a.close)
        # Bounded: a fix may make close() wait for the post (it cannot end first).
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


# -- 7. a re-sent ACQUIRE after a FORGET ----------------------------------------------


def test_a_resent_acquire_after_a_forget_leads_the_flight_its_joiner_joined(
    redis_server: RedisServer, holding_proxy: HoldingCutProxy, namespace: str
) -> None:
    """A's ACQUIRE leads t1 in Redis; its reply is cut and redis-py's re-send waits at
    the proxy. Meanwhile B joins t1 and another group forgets the key (t1 is parked:
    "it runs on and lands for its joiners"). The re-send finds no record with its
    nonce and leads t2: A runs the work once, under t2, and lands it; t1 is never
    renewed nor landed, so B, whose leader lives, is interrupted after a lease."""
    key = f"acq-{uuid.uuid4().hex}"
    a = fleet_group(holding_proxy.url, namespace, lease=1.5)
    b = fleet_group(redis_server.url, namespace, lease=1.5)
    forgetter = fleet_group(redis_server.url, namespace, lease=1.5)
    tokens: list[int] = []
    joined = threading.Event()

    def work() -> str:
        tokens.append(current_lease().token)
        return "v"

    threads: list[threading.Thread] = []
    try:
        a.run_sync("warm-up", lambda: 0)  # scripts loaded, a connection idles
        holding_proxy.arm(key.encode())  # ACQUIRE carries the raw key
        lead, led = in_thread(a.run_sync, key, work)
        threads.append(lead)
        assert holding_proxy.held.wait(10)  # t1 led in Redis; the re-send is held
        assert holding_proxy.cuts == 1
        join, got = in_thread(b.run_sync, key, never, on_join=joined.set)
        threads.append(join)
        assert joined.wait(10)
        forgetter.forget(key)  # t1 parked
        holding_proxy.release()
        lead.join(10)
        join.join(10)
    finally:
        holding_proxy.release()
        for thread in threads:
            thread.join(10)
        for g in (a, b, forgetter):
            g.close()
    assert outcome(led).value == "v" and tokens == [outcome(led).token]  # ran once
    result = outcome(got)
    assert not isinstance(result, FlightInterruptedError), result
    assert result.value == "v" and result.joined


# -- 8. the first call of a group on a frozen server ----------------------------------


def test_the_first_call_does_not_wait_for_the_startup_pipeline(
    redis_server: RedisServer, namespace: str
) -> None:
    """fleet-protocol.md: a frozen server ends a new call "after 4 command timeouts".
    A group's first call waited for its startup pipeline (SCRIPT LOAD and CONFIG GET,
    with redis-py's own retries: 4 more command timeouts on a frozen server) before its
    own ACQUIRE. Here the startup never ends (held on an event): the first call still
    leads and returns on a live server."""
    group = fleet_group(redis_server.url, namespace)
    fleet = fleet_of(group)
    held, release = threading.Event(), threading.Event()
    startup = fleet._startup

    async def held_startup() -> None:
        held.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        await startup()

    fleet._startup = held_startup  # type: ignore[method-assign]
    try:
        result = group.run_sync("k", lambda: "v", timeout=10)
        assert held.is_set()  # the startup was running all along
    finally:
        release.set()
        group.close()
    assert result.value == "v" and not result.joined


# -- 9. forget() racing close() --------------------------------------------------------


def test_a_forget_racing_close_raises_no_cancelled_error(
    redis_server: RedisServer, namespace: str
) -> None:
    a = fleet_group(redis_server.url, namespace)
    a.run_sync("warm-up", lambda: 0)
    ran, release = threading.Event(), threading.Event()
    _hold(fleet_of(a), "forget", ran, release)
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


# -- 10. a joiner that follows a retry waits its own lease, not the leader's ------------


def test_a_joiner_that_followed_a_retry_hears_its_leaders_death_within_the_leaders_lease(
    redis_server: RedisServer, namespace: str
) -> None:
    """The leader (lease 1 s) retries, then stops renewing, as a dead process would: its
    record runs out 1 s later. A joiner of a group with a lease of 30 s follows the
    retry's `next` and must be interrupted about a (leader's) lease later, as it is
    without a retry; it waits until its own deadline of 30 s instead."""
    a = fleet_group(redis_server.url, namespace, lease=1.0, retry=_RETRY_NOW)
    b = fleet_group(redis_server.url, namespace, lease=30.0)
    fleet = fleet_of(a)
    tokens: list[int] = []
    joined, fail, release = threading.Event(), threading.Event(), threading.Event()

    async def no_renewal(batch: Any) -> None:
        return None

    def work() -> str:
        tokens.append(current_lease().token)
        if len(tokens) == 1:
            assert fail.wait(10)
            raise ValueError("first attempt")
        fleet._renew_some = no_renewal  # type: ignore[method-assign]  # "dies" here
        release.wait(20)
        return "late"

    lead, _ = in_thread(a.run_sync, "k", work)
    try:
        wait_until(lambda: bool(tokens), "the first attempt")
        join, got = in_thread(b.run_sync, "k", never, on_join=joined.set, timeout=4.0)
        assert joined.wait(10)
        fail.set()
        join.join(10)
    finally:
        fail.set()
        release.set()
        lead.join(10)
        a.close()
        b.close()
    assert len(tokens) == 2  # it followed the retry
    result = outcome(got)
    assert not isinstance(result, TimeoutError), "still waiting 4 s after a 1 s lease ran out"
    assert isinstance(result, FlightInterruptedError), result


# -- pins: what was checked and found right -------------------------------------------


def test_calls_and_closes_leave_no_connection_or_thread_behind(
    server: RedisServer, namespace: str
) -> None:
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


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[CutProxy]:
    p = CutProxy(redis_server.port)
    try:
        yield p
    finally:
        p.close()


def test_a_resent_attempt_keeps_the_flight_and_its_joiners(
    redis_server: RedisServer, proxy: CutProxy, namespace: str
) -> None:
    """A retry's ATTEMPT runs in Redis, its reply is cut, redis-py re-sends it: the
    re-send answers the same new token, the joiner follows `next` to it, and the work
    runs once per attempt."""
    key = f"attempt-{uuid.uuid4().hex}"
    names = _Names(namespace, key, False)
    a = fleet_group(proxy.url, namespace, retry=_RETRY_NOW)
    b = fleet_group(redis_server.url, namespace)
    tokens: list[int] = []
    joined = threading.Event()

    def work() -> str:
        tokens.append(current_lease().token)
        if len(tokens) == 1:
            proxy.arm(names.mailbox(tokens[0]).encode())  # only the ATTEMPT names it
            assert joined.wait(10)
            raise ValueError("first attempt")
        return "v"

    thread, led = in_thread(a.run_sync, key, work)
    try:
        wait_until(lambda: bool(tokens), "the first attempt")
        got = b.run_sync(key, never, on_join=joined.set)
        thread.join(10)
    finally:
        joined.set()
        a.close()
        b.close()
    assert proxy.cuts == 1
    assert len(tokens) == 2 and tokens[1] > tokens[0]
    assert outcome(led).value == "v" and outcome(led).token == tokens[1]
    assert got.value == "v" and got.joined and got.token == tokens[1]
    entries = redis_server.client().xrange(names.mailbox(tokens[0]))
    assert [e[1] for e in entries] == [{b"c": b"next", b"v": str(tokens[1]).encode()}]


@pytest.mark.parametrize("step", ["acquire", "attempt", "complete"])
def test_a_leading_callers_timeout_at_each_step_withdraws_only_that_caller(
    redis_server: RedisServer, namespace: str, step: str
) -> None:
    """The leading caller's own timeout passes while the reply of ``step`` (run in
    Redis) is held: it raises TimeoutError; the flight goes on and the joiner in
    another group gets its value."""
    key = f"timeout-{step}-{uuid.uuid4().hex}"
    a = fleet_group(redis_server.url, namespace, retry=_RETRY_NOW if step == "attempt" else None)
    b = fleet_group(redis_server.url, namespace)
    a.run_sync("warm-up", lambda: 0)
    ran, release, joined = threading.Event(), threading.Event(), threading.Event()
    _hold(fleet_of(a), step, ran, release)
    runs: list[int] = []

    def work() -> str:
        runs.append(current_lease().token)
        assert joined.wait(10)
        if step == "attempt" and len(runs) == 1:
            raise ValueError("first attempt")
        return "v"

    thread, led = in_thread(a.run_sync, key, work, timeout=1.0)
    try:
        if step == "acquire":
            assert ran.wait(10)  # led in Redis: the joiner can join it already
        else:
            wait_until(lambda: bool(runs), "the work")
        join, got = in_thread(b.run_sync, key, never, on_join=joined.set)
        assert joined.wait(10)
        thread.join(10)
        assert ran.is_set()
        assert isinstance(outcome(led), TimeoutError)
        release.set()
        join.join(10)
    finally:
        joined.set()
        release.set()
        a.close()
        b.close()
    result = outcome(got)
    assert result.value == "v" and result.joined and result.token == runs[-1]
    assert len(runs) == (2 if step == "attempt" else 1)


def test_close_waits_for_a_landing_in_flight(redis_server: RedisServer, namespace: str) -> None:
    a = fleet_group(redis_server.url, namespace)
    b = fleet_group(redis_server.url, namespace)
    fleet = fleet_of(a)
    a.run_sync("warm-up", lambda: 0)
    order: list[str] = []
    ran, release, closing, joined = (threading.Event() for _ in range(4))
    _hold(fleet, "complete", ran, release, heard=lambda: order.append("landing heard"))
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


def test_closing_a_joiners_group_ends_its_blocked_read(
    server: RedisServer, namespace: str
) -> None:
    client = server.client()
    a = fleet_group(server.url, namespace, lease=30)
    b = fleet_group(server.url, namespace, lease=30)
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(10)
        return "v"

    thread, led = in_thread(a.run_sync, "k", work)
    try:
        assert started.wait(10)
        join, got = in_thread(b.run_sync, "k", never)
        wait_until(lambda: int(client.info("clients")["blocked_clients"]) == 1, "the read")
        b.close()
        join.join(10)
        assert isinstance(outcome(got), GroupClosedError)
        wait_until(lambda: int(client.info("clients")["blocked_clients"]) == 0, "no read")
        release.set()
        thread.join(10)
    finally:
        release.set()
        a.close()
        b.close()
    assert outcome(led).value == "v"


def test_odd_keys_and_a_namespace_of_glob_characters(
    redis_server: RedisServer, namespace: str
) -> None:
    """A key with braces, glob characters and non-ASCII is one flight for two
    groups; status() of a namespace made of glob characters lists exactly its own
    flights (its SCAN pattern is escaped)."""
    globby = f"{namespace}*?[x]\\"
    key = "{a}*?[b]\\ é"
    a, b = fleet_group(redis_server.url, globby), fleet_group(redis_server.url, globby)
    # The unescaped pattern fg:{NS*?[x]\\:* would match this namespace's records.
    other = fleet_group(redis_server.url, f"{namespace}Qx")
    started, joined, other_started, release = (threading.Event() for _ in range(4))

    def work() -> str:
        started.set()
        assert joined.wait(10)
        return "v"

    def other_work() -> str:
        other_started.set()
        assert release.wait(10)
        return "o"

    lead, led = in_thread(a.run_sync, key, work)
    side, _ = in_thread(other.run_sync, "other", other_work)
    try:
        assert started.wait(10) and other_started.wait(10)
        assert [f["key"] for f in fleet_of(b).status()] == [key]
        got = b.run_sync(key, never, on_join=joined.set)
        lead.join(10)
    finally:
        joined.set()
        release.set()
        side.join(10)
        for g in (a, b, other):
            g.close()
    assert got.value == "v" and got.joined and got.token == outcome(led).token
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert _Names(globby, key, False).record == f"fg:{{{globby}:{digest}}}"
    assert keys_without_ttl(redis_server.client(), "fg:*") == []
