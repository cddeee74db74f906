"""A script whose reply is lost and that redis-py re-sends acts once: a re-sent ACQUIRE
still leads its own parked flight (after a forget, or a new flight of the key), a re-
sent ATTEMPT keeps the flight and its joiners, and a re-sent FORGET leaves the key's
next flight alone (the script remembers the forget's nonce, with a TTL).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from flightgroup import (
    FlightInterruptedError,
    Retention,
    current_lease,
)
from flightgroup.redis import scripts
from flightgroup.redis.names import Names

from ..infleet import RETRY_NOW, fleet_group, never, never_runs, result_of
from ..redisproc import CutProxy, HoldingCutProxy, RedisServer, keys_without_ttl
from ..support import in_thread, outcome, wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_resent_acquire_still_leads_its_parked_flight_when_a_new_flight_started(
    redis_server: RedisServer, holding_proxy: HoldingCutProxy, namespace: str
) -> None:
    """A re-sent ACQUIRE still leads its parked flight when a new flight started.

    A's ACQUIRE leads t1 in Redis; its reply is cut and redis-py's re-send waits at the proxy. B
    joins t1. Another process forgets the key and calls it at once (its work runs, held): it
    leads t2. A's re-send is let through: it leads t1 again (its nonce's ``…:o:`` key names t1,
    still running with A's nonce), so B gets A's value."""
    key = f"acq-{uuid.uuid4().hex}"
    a = fleet_group(holding_proxy.url, namespace, lease=1.5)
    b = fleet_group(redis_server.url, namespace, lease=1.5)
    other = fleet_group(redis_server.url, namespace, lease=1.5)
    joined, other_runs, other_release = threading.Event(), threading.Event(), threading.Event()
    tokens: list[int] = []

    def work() -> str:
        tokens.append(current_lease().token)
        return "A's value"

    def other_work() -> str:
        other_runs.set()
        other_release.wait(20)
        return "the other's value"

    threads: list[threading.Thread] = []
    try:
        a.run_sync("warm-up", lambda: 0)  # scripts loaded, a connection idles
        holding_proxy.arm(key.encode())  # ACQUIRE carries the raw key
        lead, led = in_thread(a.run_sync, key, work)
        threads.append(lead)
        assert holding_proxy.held.wait(10)  # t1 led in Redis; the re-send is held
        assert holding_proxy.cuts == 1
        join, got = in_thread(b.run_sync, key, never, on_join=joined.set, timeout=15)
        threads.append(join)
        assert joined.wait(10)  # B waits for t1
        other.forget(key)  # t1 parked (…:o:<A's nonce> names it)
        second, _ = in_thread(other.run_sync, key, other_work, timeout=20)
        threads.append(second)
        assert other_runs.wait(10)  # t2 runs, led by the other process
        holding_proxy.release()  # A's re-sent ACQUIRE reaches Redis now
        join.join(15)
        other_release.set()
        lead.join(15)
    finally:
        holding_proxy.release()
        other_release.set()
        for thread in threads:
            thread.join(15)
        for g in (a, b, other):
            g.close()
    result = outcome(got)
    assert not isinstance(result, FlightInterruptedError), (
        f"B's flight t1 was dropped while its leader A lived: {result!r}; "
        f"A got {outcome(led)!r}, its work ran {len(tokens)} time(s)"
    )
    assert result.value == "A's value" and result.joined
    assert outcome(led).value == "A's value" and not outcome(led).joined


@pytest.mark.timeout(40)
@pytest.mark.parametrize("newer", ["running", "kept"])
def test_a_resent_forget_leaves_the_next_flight_alone(
    redis_server: RedisServer, holding_proxy: HoldingCutProxy, namespace: str, newer: str
) -> None:
    """A re-sent FORGET answers as the first send did and leaves the next flight alone.

    The first FORGET parks flight t1; its reply is cut; before redis-py's re-send
    reaches Redis another process leads t2 (and, "kept", lands it with retention).
    The re-send must answer as the first send did and leave t2 alone."""
    key = f"forget-{uuid.uuid4().hex}"
    names = Names(namespace, key, False)
    client = redis_server.client()
    gate1, gate2 = threading.Event(), threading.Event()
    started1, started2 = threading.Event(), threading.Event()
    tokens: dict[str, int] = {}

    def first() -> str:
        tokens["first"] = current_lease().token
        started1.set()
        assert gate1.wait(20)
        return "first"

    def second() -> str:
        tokens["second"] = current_lease().token
        started2.set()
        if newer == "running":
            assert gate2.wait(20)
        return "second"

    retention = Retention(success=30.0) if newer == "kept" else None
    forgetter = fleet_group(holding_proxy.url, namespace)
    a = fleet_group(redis_server.url, namespace)
    b = fleet_group(redis_server.url, namespace, retention=retention)
    c = fleet_group(redis_server.url, namespace)
    threads: list[threading.Thread] = []
    try:
        forgetter.run_sync("warm-up", lambda: 0)  # its scripts are loaded, a connection idles
        lead1, out1 = in_thread(a.run_sync, key, first)
        threads.append(lead1)
        assert started1.wait(10)
        holding_proxy.arm(names.record.encode())  # FORGET names the key's record
        forgetting, forgot = in_thread(forgetter.forget, key)
        threads.append(forgetting)
        # Redis ran the FORGET (t1 parked), its reply was cut, and the re-send waits
        # at the proxy.
        assert holding_proxy.held.wait(10), forgot
        assert holding_proxy.cuts == 1
        assert not client.exists(names.record)
        assert client.hget(names.parked(tokens["first"]), "t") == str(tokens["first"]).encode()

        # In the gap, another process leads the next flight.
        lead2, out2 = in_thread(b.run_sync, key, second)
        threads.append(lead2)
        assert started2.wait(10)
        if newer == "kept":
            lead2.join(10)
            assert result_of(out2).value == "second"
            assert client.hget(names.record, "s") == b"D"
        second_token = tokens["second"]
        assert second_token > tokens["first"]

        holding_proxy.release()  # the re-sent FORGET reaches Redis now
        forgetting.join(15)
        assert "error" not in forgot, forgot  # it answered (as the first send did)
        assert client.hget(names.record, "t") == str(second_token).encode()
        assert not client.exists(names.parked(second_token))  # t2 was not parked

        if newer == "running":
            joined = threading.Event()
            join, got = in_thread(c.run_sync, key, never_runs, on_join=joined.set)
            threads.append(join)
            assert joined.wait(10), got
            gate2.set()
            join.join(10)
            lead2.join(10)
            assert result_of(out2).value == "second" and not result_of(out2).joined
        else:
            join, got = in_thread(c.run_sync, key, never_runs)
            join.join(10)
        # Whoever comes next gets flight t2's outcome: it was neither parked nor deleted.
        assert result_of(got).value == "second" and result_of(got).joined
        assert result_of(got).token == second_token

        gate1.set()  # the parked flight lands for its own caller
        lead1.join(10)
        assert result_of(out1).value == "first" and result_of(out1).token == tokens["first"]
        forgotten = list(client.scan_iter(match=f"{names.record}:g:*"))
        assert len(forgotten) == 1  # one nonce: the re-send wrote nothing new
        assert 0 < client.pttl(forgotten[0]) <= 60_000
    finally:
        holding_proxy.release()
        gate1.set()
        gate2.set()
        for thread in threads:
            thread.join(10)
        for g in (forgetter, a, b, c):
            g.close()
    assert keys_without_ttl(client, f"fg:{{{namespace}*") == []


@pytest.mark.timeout(20)
def test_forget_remembers_its_nonce_with_a_ttl_and_answers_once(
    redis_server: RedisServer, namespace: str
) -> None:
    """FORGET remembers its nonce with a TTL and answers a re-send with its first answer.

    The script level: a FORGET with a nonce already seen answers its first answer
    and acts on nothing; every key it writes has a TTL."""
    client = redis_server.client()
    run = {name: client.register_script(body) for name, body in scripts.SCRIPTS.items()}
    names = Names(namespace, "k", False)
    seen = names.forgot("n-1")

    def forget(nonce_key: str) -> int:
        return int(run["forget"](keys=[names.record, nonce_key], args=[60_000]))

    def acquire(nonce: str) -> int:
        reply = run["acquire"](keys=[names.record, names.fence],
                               args=[nonce, 10_000, 86_400_000, 0, 1, "h", "k"])
        assert int(reply[0]) == 1
        return int(reply[1])

    assert forget(seen) == 0  # nothing to forget, and that is remembered too
    t1 = acquire("lead-1")
    assert forget(seen) == 0  # a re-send of that forget: t1 stays
    assert client.hget(names.record, "t") == str(t1).encode()
    assert forget(names.forgot("n-2")) == 2  # a new forget parks t1
    t2 = acquire("lead-2")
    assert forget(names.forgot("n-2")) == 2  # its re-send: t2 is not parked
    assert client.hget(names.record, "t") == str(t2).encode()
    assert not client.exists(names.parked(t2))
    landed = run["complete"](keys=[names.record, names.parked(t2), names.mailbox(t2)],
                             args=[t2, "ok", b"v", 30_000, 31_000, 1024])
    assert int(landed[0]) == 1 and client.hget(names.record, "s") == b"D"
    assert forget(names.forgot("n-2")) == 2  # again: the kept outcome stays
    assert client.hget(names.record, "s") == b"D"
    assert forget(names.forgot("n-3")) == 1  # a new forget drops it
    assert not client.exists(names.record)
    for nonce in ("n-1", "n-2", "n-3"):
        assert 0 < client.pttl(names.forgot(nonce)) <= 60_000
    assert keys_without_ttl(client, f"fg:{{{namespace}*") == []


def test_a_resent_acquire_after_a_forget_leads_the_flight_its_joiner_joined(
    redis_server: RedisServer, holding_proxy: HoldingCutProxy, namespace: str
) -> None:
    """A re-sent ACQUIRE after a forget leads the flight its joiner joined.

    A's ACQUIRE leads t1 in Redis; its reply is cut and redis-py's re-send waits at the proxy.
    Meanwhile B joins t1 and another group forgets the key (t1 is parked: "it runs on and lands
    for its joiners"). The re-send finds its own parked flight by its nonce: A runs the work
    once, under t1, and lands it, so B gets A's value."""
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
    """A re-sent ATTEMPT keeps the flight and its joiners.

    A retry's ATTEMPT runs in Redis, its reply is cut, redis-py re-sends it: the
    re-send answers the same new token, the joiner follows `next` to it, and the work
    runs once per attempt."""
    key = f"attempt-{uuid.uuid4().hex}"
    names = Names(namespace, key, False)
    a = fleet_group(proxy.url, namespace, retry=RETRY_NOW)
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
