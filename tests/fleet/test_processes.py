"""The fleet scope with real processes: one run for callers in several processes,
errors and codecs across processes, leaders killed or frozen past their lease, Redis
restarted empty, retention, fresh calls, forget, limits, retries, closing.

Every child is a ``tests.dirproc`` process of a fleet group (``redis=URL,
namespace=NS``) driven over pipes. Interleavings are forced with blocking works
(released by a command), on_join events, SIGSTOP/SIGCONT, and states read from Redis
itself (a record gone, a joiner's blocking read parked in the server); nothing waits
on a bare sleep or asserts a duration. Tests that need a lease to run out use a lease
of 1 s; the tests that kill or restart Redis use a server of their own.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest

from flightgroup.redis.clients import command_timeout

from ..dirproc import (
    Child,
    Harness,
    assert_error,
    assert_value,
    herd_takes_over_a_killed_leader,
    wait_any,
    wait_for,
)
from ..redisproc import RedisServer, keys_without_ttl

# the last test checks what the others left in the module's server: one worker, in order
pytestmark = [pytest.mark.timeout(60), pytest.mark.xdist_group("fleet_processes")]

SHORT = 1.0  # the lease of tests that wait for one to run out


def record(ns: str, key: str) -> str:
    """The Redis name of a key's flight record (scripts.py)."""
    return f"fg:{{{ns}:{hashlib.sha256(key.encode()).hexdigest()}}}"


def mailbox(ns: str, key: str, token: int) -> str:
    return f"{record(ns, key)}:m:{token}"


def fleet(h: Harness, name: str, server: RedisServer, ns: str, **config: Any) -> Child:
    return h.spawn(name, redis=server.url, namespace=ns, **config)


def blocked_readers(server: RedisServer) -> int:
    """How many clients of the server wait in a blocking read: one per process that
    waits for a flight's outcome (a joiner, or a fresh caller waiting for the end)."""
    return int(server.client().info("clients")["blocked_clients"])


# -----------------------------------------------------------------------------
# one run
# -----------------------------------------------------------------------------


def test_one_run_for_callers_in_four_processes(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a, b, c, d = (fleet(h, name, redis_server, namespace) for name in "abcd")
    a.call("l", "k", h.work(block=True, **{"return": {"n": [1, 2]}}))
    started = a.expect("started", "l")
    callers = [
        (a, "a1", "async"),
        (b, "b1", "sync"), (b, "b2", "async"), (b, "b3", "sync"),
        (c, "c1", "async"), (c, "c2", "async"),
        (d, "d1", "sync"), (d, "d2", "sync"),
    ]  # fmt: skip
    for child, call_id, mode in callers:
        child.call(call_id, "k", h.work(**{"return": "not me"}), mode=mode)
    for child, call_id, _ in callers:
        child.expect("joined", call_id)
    # Many local callers, one request per process: Redis counts three joining processes.
    assert redis_server.client().hget(record(namespace, "k"), "j") == b"3"
    a.release("l")

    lead = a.expect("done", "l")
    assert_value(lead, {"n": [1, 2]}, joined=False)
    assert lead["token"] == started["token"]
    for child, call_id, _ in callers:
        done = child.expect("done", call_id)
        assert_value(done, {"n": [1, 2]}, joined=True)
        assert done["token"] == started["token"]
        assert child.count("joined", call_id) == 1
    assert a.count("joined", "l") == 0
    assert h.runs_of("k") == [(a.pid, "k", started["token"])]
    # No retention: the record is gone, the next call leads a new flight.
    assert not redis_server.client().exists(record(namespace, "k"))
    b.call("n", "k", h.work(**{"return": "again"}))
    done = b.expect("done", "n")
    assert_value(done, "again", joined=False)
    assert done["token"] > started["token"]


# -----------------------------------------------------------------------------
# errors and codecs
# -----------------------------------------------------------------------------


def test_an_error_reaches_every_process_and_the_key_is_not_poisoned(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a, b, c = (fleet(h, name, redis_server, namespace) for name in "abc")
    a.call("l", "k", h.work(block=True, **{"raise": "boom"}))
    started = a.expect("started", "l")
    b.call("j", "k", h.work(), mode="async")
    b.expect("joined", "j")
    c.call("j", "k", h.work())
    c.expect("joined", "j")
    a.release("l")

    lead = a.expect("done", "l")
    assert_error(lead, "ValueError")
    assert lead["message"] == "boom"
    for child in (b, c):
        attrs = assert_error(child.expect("done", "j"), "FlightFailedError")
        assert attrs["key"] == "k"
        assert attrs["error_type"] == "ValueError"
        assert attrs["error_module"] == "builtins"
        assert attrs["message"] == "boom"
    assert h.runs_of("k") == [(a.pid, "k", started["token"])]

    # No poisoned key: the next call (in a joiner's process) leads a new flight.
    b.call("n", "k", h.work(**{"return": "fine"}))
    done = b.expect("done", "n")
    assert_value(done, "fine", joined=False)
    assert done["token"] > started["token"]
    assert [entry[0] for entry in h.runs_of("k")] == [a.pid, b.pid]


def test_an_unencodable_value_fails_the_flight_for_all(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a, b = (fleet(h, name, redis_server, namespace) for name in "ab")
    a.call("l", "k", h.work(block=True, unencodable=True))
    a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    a.release("l")

    lead = a.expect("done", "l")
    assert not lead["ok"], lead
    assert lead["error_type"] == "TypeError", lead  # json's own encode error
    attrs = assert_error(b.expect("done", "j"), "FlightFailedError")
    assert attrs["error_type"] == lead["error_type"]
    assert attrs["message"] == lead["message"]

    b.call("n", "k", h.work(**{"return": [1]}))
    assert_value(b.expect("done", "n"), [1], joined=False)
    assert len(h.runs_of("k")) == 2


def test_a_decode_failure_fails_only_that_caller(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a = fleet(h, "a", redis_server, namespace, codec="test")
    b = fleet(h, "b", redis_server, namespace, codec="test", fail_decode=True)
    c = fleet(h, "c", redis_server, namespace, codec="test")

    # A joiner whose decode fails: only that joiner fails.
    a.call("l", "k", h.work(block=True, **{"return": "!decoded"}))
    started = a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    c.call("j", "k", h.work(), mode="async")
    c.expect("joined", "j")
    a.release("l")
    assert_value(a.expect("done", "l"), "!decoded", joined=False)
    assert_error(b.expect("done", "j"), "DecodeFailure")
    done = c.expect("done", "j")
    assert_value(done, "!decoded", joined=True)
    assert done["token"] == started["token"]

    # A leader whose decode fails: the flight landed for its joiners all the same.
    b.call("l2", "k2", h.work(block=True, **{"return": "!dec again"}))
    started = b.expect("started", "l2")
    a.call("j2", "k2", h.work())
    a.expect("joined", "j2")
    c.call("j2", "k2", h.work())
    c.expect("joined", "j2")
    b.release("l2")
    assert_error(b.expect("done", "l2"), "DecodeFailure")
    for child in (a, c):
        done = child.expect("done", "j2")
        assert_value(done, "!dec again", joined=True)
        assert done["token"] == started["token"]
    assert len(h.runs_of("k")) == 1 and len(h.runs_of("k2")) == 1


def test_a_value_over_max_value_bytes(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a = fleet(h, "a", redis_server, namespace, max_value_bytes=100)
    b = fleet(h, "b", redis_server, namespace)
    a.call("l", "k", h.work(block=True, return_chars=200))
    a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    a.release("l")

    attrs = assert_error(a.expect("done", "l"), "ValueTooLargeError")
    assert attrs["size"] == 202 and attrs["limit"] == 100  # the JSON string's quotes
    attrs = assert_error(b.expect("done", "j"), "FlightFailedError")
    assert attrs["error_type"] == "ValueTooLargeError"

    a.call("n", "k", h.work(**{"return": "small"}))
    assert_value(a.expect("done", "n"), "small", joined=False)
    assert len(h.runs_of("k")) == 2

    # The bound is a value's: an error whose description is longer still lands, its
    # message cut to a quarter of the bound in characters (each is 4 UTF-8 bytes at most).
    a.call("e", "k2", h.work(block=True, **{"raise": "e" * 300}))
    a.expect("started", "e")
    b.call("j", "k2", h.work())
    b.expect("joined", "j")
    a.release("e")
    assert_error(a.expect("done", "e"), "ValueError")
    attrs = assert_error(b.expect("done", "j"), "FlightFailedError")
    assert attrs["error_type"] == "ValueError" and attrs["message"] == "e" * 25 + "... (cut)"


# -----------------------------------------------------------------------------
# leaders killed, frozen; Redis restarted
# -----------------------------------------------------------------------------


def test_leader_killed_joiner_interrupted_next_call_leads(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a, b, c = (fleet(h, name, redis_server, namespace, lease=SHORT) for name in "abc")
    a.call("l", "k", h.work(block=True, **{"return": "never"}))
    started = a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    c.call("j", "k", h.work(), mode="async")
    c.expect("joined", "j")

    a.kill()
    for child in (b, c):
        attrs = assert_error(child.expect("done", "j", timeout=10), "FlightInterruptedError")
        assert attrs["key"] == "k"
    assert h.runs_of("k") == [(a.pid, "k", started["token"])]  # no joiner ran it

    b.call("n", "k", h.work(**{"return": "again"}))
    done = b.expect("done", "n")
    assert_value(done, "again", joined=False)
    assert done["token"] > started["token"]
    assert [entry[0] for entry in h.runs_of("k")] == [a.pid, b.pid]


def test_a_herd_takes_over_the_flight_of_a_killed_leader(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    """takeover=1: the leader's process is SIGKILLed mid-work in a herd of 4 processes x
    75 callers: no caller of the other three fails (they hear it when its lease runs
    out) and the work ran exactly twice."""
    children = [
        fleet(h, name, redis_server, namespace, lease=1.0, takeover=1) for name in "abcd"
    ]
    herd_takes_over_a_killed_leader(h, children, callers=75)


def test_leader_killed_a_waiting_fresh_caller_leads_the_next_flight(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a, b, c = (fleet(h, name, redis_server, namespace, lease=SHORT) for name in "abc")
    wait_for(lambda: blocked_readers(redis_server) == 0, "no reader of an earlier test")
    a.call("l", "k", h.work(block=True, **{"return": "never"}))
    started = a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    c.call("f", "k", h.work(**{"return": "fresh"}), fresh=True, mode="async")
    wait_for(lambda: blocked_readers(redis_server) == 2, "the fresh caller to wait")

    a.kill()
    assert_error(b.expect("done", "j", timeout=10), "FlightInterruptedError")
    # The fresh caller never joined the dead flight: it leads the next one.
    done = c.expect("done", "f", timeout=10)
    assert_value(done, "fresh", joined=False)
    assert done["token"] > started["token"]
    assert c.count("joined", "f") == 0
    assert [entry[0] for entry in h.runs_of("k")] == [a.pid, c.pid]


def test_a_frozen_leader_past_its_lease_is_fenced(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    client = redis_server.client()
    a, b, c = (fleet(h, name, redis_server, namespace, lease=SHORT) for name in "abc")
    a.call("l", "k", h.work(block=True, **{"return": "old"}))
    old = a.expect("started", "l")["token"]
    a.call("aj", "k", h.work(), mode="async")  # a joiner in the stale leader's process
    a.expect("joined", "aj")
    c.call("j1", "k", h.work())  # a joiner in a third process, before the freeze
    c.expect("joined", "j1")

    a.stop()
    wait_for(lambda: not client.exists(record(namespace, "k")), "the lease to run out")
    # The joiner elsewhere hears that the flight is gone.
    assert_error(c.expect("done", "j1", timeout=10), "FlightInterruptedError")

    b.call("l", "k", h.work(block=True, **{"return": "new"}))
    new = b.expect("started", "l")["token"]
    assert new > old
    c.call("j2", "k", h.work(), mode="async")
    c.expect("joined", "j2")

    a.cont()
    a.release("l")
    lead = a.expect("done", "l")
    assert_error(lead, "LeaseLostError")
    assert_error(a.expect("done", "aj"), "FlightInterruptedError")
    # Nothing of the stale flight landed: its mailbox (if any) says interrupted.
    entries = client.xrange(mailbox(namespace, "k", old))
    assert all(fields[b"c"] == b"int" for _, fields in entries), entries
    assert client.hget(record(namespace, "k"), "t") == str(new).encode()

    b.release("l")
    assert_value(b.expect("done", "l"), "new", joined=False)
    done = c.expect("done", "j2")
    assert_value(done, "new", joined=True)
    assert done["token"] == new
    assert h.runs_of("k") == [(a.pid, "k", old), (b.pid, "k", new)]
    # No outcome crossed flights: "old" reached nobody.
    for child in (a, b, c):
        assert all(e.get("value") != "old" for e in child.events if e.get("ev") == "done")


def test_a_joiner_frozen_while_its_leader_lands_reads_the_reply_in_its_socket(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    """A joiner frozen past its read's own limit and its mailbox's life, while its
    leader landed, gets the value the reply in its socket holds."""
    client = redis_server.client()
    lease = 3.0  # a read blocks at least ~2 s (2/3 of a lease): the landing comes first
    a, b = (fleet(h, name, redis_server, namespace, lease=lease) for name in "ab")
    a.call("l", "k", h.work(block=True, **{"return": "v"}))
    token = a.expect("started", "l")["token"]
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    wait_for(lambda: blocked_readers(redis_server) == 1, "b's read to wait in the server")
    read_seen = time.monotonic()  # b's read began no later
    b.stop()
    a.release("l")
    assert_value(a.expect("done", "l"), "v", joined=False)
    # Landed while b's read still blocked in the server: its reply is in b's socket.
    assert time.monotonic() - read_seen < 1.0

    # b stays frozen past its read's own limit (block + a command's timeout) and past
    # the mailbox's life: the reply in its socket is the only copy of the outcome left.
    wait_for(lambda: not client.exists(mailbox(namespace, "k", token)), "the mailbox to expire")
    limit = read_seen + lease + 0.05 + command_timeout(lease)
    wait_for(lambda: time.monotonic() > limit, "b's read to pass its own limit")
    b.cont()

    done = b.expect("done", "j")
    assert_value(done, "v", joined=True)
    assert done["token"] == token
    assert h.runs_of("k") == [(a.pid, "k", token)]


def test_a_thawed_leader_hears_its_lease_is_lost(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    client = redis_server.client()
    a = fleet(h, "a", redis_server, namespace, lease=SHORT)
    a.call("l", "k", h.work(wait_lost=True, raise_lease=True), mode="async")
    a.expect("started", "l")
    a.stop()
    wait_for(lambda: not client.exists(record(namespace, "k")), "the lease to run out")
    a.cont()
    # Its first renewal after the thaw finds no flight: the work's lease says lost.
    assert a.expect("lost", "l")["lost"] is True
    done = a.expect("done", "l")
    assert_error(done, "LeaseLostError")
    assert done["same_as_work_error"] is True  # the work's own LeaseLostError


@pytest.mark.timeout(40)
def test_redis_restarted_without_persistence_during_a_flight(h: Harness, namespace: str) -> None:
    server = RedisServer()
    try:
        # A lease of 2 s: the joiner tolerates an unreachable server for its wait plus a
        # lease before it would give up with UnavailableError; the restart is far shorter.
        a, b, c = (fleet(h, name, server, namespace, lease=2.0) for name in "abc")
        a.roundtrip("warm")  # an earlier flight, for the token order below
        warm = a.last("done", "warm")["token"]
        a.call("l", "k", h.work(block=True, **{"return": "lost"}))
        old = a.expect("started", "l")["token"]
        b.call("j", "k", h.work())
        b.expect("joined", "j")
        wait_for(lambda: blocked_readers(server) == 1, "the joiner's read to reach Redis")

        server.restart()  # empty: the record, the fence and the mailboxes are gone
        # The joiner does not hang: Redis came back at once, and holds no flight of
        # its token (CHECK answers gone): interrupted, not unavailable.
        attrs = assert_error(b.expect("done", "j", timeout=15), "FlightInterruptedError")
        assert attrs["key"] == "k"
        # The leader cannot land: Redis holds no flight of its token (RENEW answers
        # 0, or COMPLETE is fenced), so it gets LeaseLostError, never its value.
        a.release("l")
        assert_error(a.expect("done", "l", timeout=15), "LeaseLostError")

        # A new call leads; its token, seeded from the server's clock, beats them all.
        c.call("n", "k", h.work(**{"return": "after"}))
        done = c.expect("done", "n")
        assert_value(done, "after", joined=False)
        assert done["token"] > old > warm
        assert [entry[0] for entry in h.runs_of("k")] == [a.pid, c.pid]
        assert keys_without_ttl(server.client()) == []
    finally:
        server.close()


# -----------------------------------------------------------------------------
# retention, fresh, forget, limits
# -----------------------------------------------------------------------------


def test_a_kept_outcome_is_served_to_other_processes(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a = fleet(h, "a", redis_server, namespace, keep_success=30.0)
    b, c = (fleet(h, name, redis_server, namespace) for name in "bc")
    a.call("l", "k", h.work(**{"return": {"kept": True}}))
    lead = a.expect("done", "l")
    assert_value(lead, {"kept": True}, joined=False)

    for child, mode in ((b, "sync"), (c, "async")):
        child.call("k1", "k", h.work(**{"return": "not me"}), mode=mode)
        done = child.expect("done", "k1")
        assert_value(done, {"kept": True}, joined=True)
        assert done["token"] == lead["token"]
        assert child.count("joined", "k1") == 0  # no on_join for a kept outcome
    assert h.runs_of("k") == [(a.pid, "k", lead["token"])]

    # forget in another process: the next call (in a third) leads a new run.
    b.send(cmd="forget", key="k")
    assert b.expect("forgot")["error"] is None
    c.call("k2", "k", h.work(**{"return": "new"}))
    done = c.expect("done", "k2")
    assert_value(done, "new", joined=False)
    assert done["token"] > lead["token"]
    assert [entry[0] for entry in h.runs_of("k")] == [a.pid, c.pid]


def test_a_kept_failure_and_a_fresh_call_after_a_kept_value(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a = fleet(h, "a", redis_server, namespace, keep_success=30.0, keep_error=30.0)
    b = fleet(h, "b", redis_server, namespace)
    a.call("e", "bad", h.work(**{"raise": "kept boom"}))
    failed = a.expect("done", "e")
    assert_error(failed, "ValueError")
    b.call("e", "bad", h.work(**{"return": "not me"}))
    attrs = assert_error(b.expect("done", "e"), "FlightFailedError")
    assert attrs["error_type"] == "ValueError" and attrs["message"] == "kept boom"
    assert len(h.runs_of("bad")) == 1

    a.call("v", "good", h.work(**{"return": "kept"}))
    kept = a.expect("done", "v")
    # A fresh call accepts only a flight that starts after it: never the kept value.
    b.call("f", "good", h.work(**{"return": "fresh"}), fresh=True)
    done = b.expect("done", "f")
    assert_value(done, "fresh", joined=False)
    assert done["token"] > kept["token"]
    assert [entry[0] for entry in h.runs_of("good")] == [a.pid, b.pid]


def test_a_deadline_times_out_the_flight_in_every_process(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a = fleet(h, "a", redis_server, namespace, deadline=0.5)
    b = fleet(h, "b", redis_server, namespace)
    a.call("l", "k", h.work(block=True), mode="async")
    a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")  # never released: the attempt runs past its deadline

    attrs = assert_error(a.expect("done", "l"), "FlightTimeoutError")
    assert attrs["deadline"] == 0.5
    attrs = assert_error(b.expect("done", "j"), "FlightTimeoutError")
    assert attrs["deadline"] == 0.5 and attrs["key"] == "k"
    b.call("n", "k", h.work(**{"return": "in time"}))
    assert_value(b.expect("done", "n"), "in time", joined=False)
    assert [entry[0] for entry in h.runs_of("k")] == [a.pid, b.pid]


def test_a_fresh_caller_does_not_join_the_running_flight(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a, b = (fleet(h, name, redis_server, namespace) for name in "ab")
    wait_for(lambda: blocked_readers(redis_server) == 0, "no reader of an earlier test")
    a.call("l", "k", h.work(block=True, **{"return": "stale"}))
    old = a.expect("started", "l")["token"]
    b.call("f", "k", h.work(**{"return": "fresh"}), fresh=True)
    # The fresh call reached Redis and waits for the running flight's end.
    wait_for(lambda: blocked_readers(redis_server) == 1, "the fresh caller to wait")
    assert not b.seen("joined", "f") and not b.seen("done", "f")
    a.release("l")

    assert_value(a.expect("done", "l"), "stale", joined=False)
    done = b.expect("done", "f")
    assert_value(done, "fresh", joined=False)
    assert done["token"] > old
    assert b.count("joined", "f") == 0
    assert h.runs_of("k") == [(a.pid, "k", old), (b.pid, "k", done["token"])]


def test_fresh_callers_of_two_processes_share_the_next_flight(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a = fleet(h, "a", redis_server, namespace, keep_success=30.0)
    b, c = (fleet(h, name, redis_server, namespace) for name in "bc")
    wait_for(lambda: blocked_readers(redis_server) == 0, "no reader of an earlier test")
    a.call("l", "k", h.work(block=True, **{"return": "stale"}))
    old = a.expect("started", "l")["token"]
    for child, mode in ((b, "sync"), (c, "async")):
        child.call("f", "k", h.work(block=True, **{"return": child.name}), fresh=True, mode=mode)
    wait_for(lambda: blocked_readers(redis_server) == 2, "both fresh callers to wait")
    a.release("l")  # kept: a fresh caller must not take the kept outcome either
    assert_value(a.expect("done", "l"), "stale", joined=False)

    leader = wait_any([b, c], "started", "f")
    other = c if leader is b else b
    new = leader.expect("started", "f")["token"]
    other.expect("joined", "f")
    leader.release("f")
    lead = leader.expect("done", "f")
    assert_value(lead, leader.name, joined=False)
    done = other.expect("done", "f")
    assert_value(done, leader.name, joined=True)
    assert lead["token"] == done["token"] == new > old
    assert h.runs_of("k") == [(a.pid, "k", old), (leader.pid, "k", new)]


def test_forget_during_a_running_flight(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a, b, c, d = (fleet(h, name, redis_server, namespace) for name in "abcd")
    a.call("l", "k", h.work(block=True, **{"return": "first"}))
    old = a.expect("started", "l")["token"]
    c.call("j", "k", h.work())
    c.expect("joined", "j")

    b.send(cmd="forget", key="k")
    assert b.expect("forgot")["error"] is None
    # The next call leads a new flight beside the running one.
    b.call("n", "k", h.work(block=True, **{"return": "second"}))
    new = b.expect("started", "n")["token"]
    assert new > old
    # (A joiner in c would join c's own local flight, the forgotten one: d joins.)
    d.call("j2", "k", h.work(), mode="async")
    d.expect("joined", "j2")

    # The forgotten flight still lands for its joiners; the new one for its own.
    a.release("l")
    assert_value(a.expect("done", "l"), "first", joined=False)
    done = c.expect("done", "j")
    assert_value(done, "first", joined=True)
    assert done["token"] == old
    assert not d.seen("done", "j2")
    b.release("n")
    assert_value(b.expect("done", "n"), "second", joined=False)
    done = d.expect("done", "j2")
    assert_value(done, "second", joined=True)
    assert done["token"] == new
    assert h.runs_of("k") == [(a.pid, "k", old), (b.pid, "k", new)]


def test_max_waiters_counts_per_process(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a = fleet(h, "a", redis_server, namespace)
    b, c = (fleet(h, name, redis_server, namespace, max_waiters=2) for name in "bc")
    a.call("l", "k", h.work(block=True, **{"return": "v"}))
    token = a.expect("started", "l")["token"]
    # As in the directory scope, a process's first caller asks Redis for the process
    # and joins the flight led in a: a joiner waiting here, counted as each later one.
    b.call("j1", "k", h.work())
    b.expect("joined", "j1")
    b.call("j2", "k", h.work(), mode="async")
    b.expect("joined", "j2")  # two joiners wait in b: at the limit
    b.call("j3", "k", h.work())
    attrs = assert_error(b.expect("done", "j3"), "TooManyWaitersError")
    assert attrs["limit"] == 2 and attrs["key"] == "k"
    assert b.count("joined", "j3") == 0
    # c counts its own: its first and second callers are fine.
    c.call("j1", "k", h.work(), mode="async")
    c.expect("joined", "j1")
    c.call("j2", "k", h.work())
    c.expect("joined", "j2")
    a.release("l")

    assert_value(a.expect("done", "l"), "v", joined=False)
    for child in (b, c):
        for call_id in ("j1", "j2"):
            done = child.expect("done", call_id)
            assert_value(done, "v", joined=True)
            assert done["token"] == token
    assert len(h.runs_of("k")) == 1


# -----------------------------------------------------------------------------
# retry, closing
# -----------------------------------------------------------------------------


def test_a_retry_is_followed_by_joiners_in_other_processes(
    h: Harness, redis_server: RedisServer, namespace: str
) -> None:
    a = fleet(h, "a", redis_server, namespace, retry_attempts=2)
    b = fleet(h, "b", redis_server, namespace)
    a.call("l", "k", h.work(block=True, raise_times=1, **{"return": "second"}))
    first = a.expect("started", "l")["token"]
    b.call("j", "k", h.work(), mode="async")
    b.expect("joined", "j")
    a.release("l")  # attempt 1 raises, attempt 2 (no block left) returns

    second = a.expect("started", "l")["token"]
    assert second > first
    lead = a.expect("done", "l")
    assert_value(lead, "second", joined=False)
    assert lead["token"] == second
    done = b.expect("done", "j")
    assert_value(done, "second", joined=True)
    assert done["token"] == second
    assert b.count("joined", "j") == 1  # on_join never again for the retry
    assert h.runs_of("k") == [(a.pid, "k", first), (a.pid, "k", second)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_closing_a_group_interrupts_its_flights_joiners_at_once(
    h: Harness, redis_server: RedisServer, namespace: str, mode: str
) -> None:
    lease = 30.0  # the joiners must hear it long before this runs out
    a, b, c = (fleet(h, name, redis_server, namespace, lease=lease) for name in "abc")
    a.call("l", "k", h.work(block=True, **{"return": "late"}), mode=mode)
    started = a.expect("started", "l")
    a.call("aj", "k", h.work(), mode="async")  # a local joiner of the closing group
    a.expect("joined", "aj")
    b.call("j", "k", h.work())
    b.expect("joined", "j")

    a.send(cmd="close", group="g0")
    assert a.expect("closed", timeout=15)["error"] is None  # not waiting for the work
    attrs = assert_error(b.expect("done", "j", timeout=lease / 3), "FlightInterruptedError")
    assert attrs["key"] == "k"
    assert_error(a.expect("done", "aj"), "GroupClosedError")
    if mode == "async":
        # An async leader waits for its work (a task the group owns): closing ends
        # the wait. A sync leader runs the work in its own thread: see below.
        assert_error(a.expect("done", "l"), "GroupClosedError")

    # Redis holds no flight of the key any more: the next call leads at once, while
    # the closed group's work still runs (no key lock in the fleet scope).
    c.call("n", "k", h.work(**{"return": "next"}))
    done = c.expect("done", "n", timeout=lease / 3)
    assert_value(done, "next", joined=False)
    assert done["token"] > started["token"]
    assert not a.seen("returning", "l")
    a.release("l")  # the work runs on to its end
    a.expect("returning", "l")
    if mode == "sync":
        assert_error(a.expect("done", "l"), "GroupClosedError")
    assert [entry[0] for entry in h.runs_of("k")] == [a.pid, c.pid]
    assert all(e.get("value") != "late" for e in b.events + c.events if e.get("ev") == "done")
    # A closed group rejects every call.
    a.call("x", "other", h.work())
    assert_error(a.expect("done", "x"), "GroupClosedError")


# -----------------------------------------------------------------------------
# last: what the module left in Redis
# -----------------------------------------------------------------------------


def test_no_key_is_left_without_a_ttl(redis_server: RedisServer) -> None:
    """Runs last (file order): every key the tests above left in the module's
    server has a TTL, and so does every kind of key this test makes itself (a kept
    record, mailboxes, the fence, a parked flight)."""
    import threading

    import flightgroup

    group = flightgroup.FlightGroup(
        redis=redis_server.url, namespace="ttl-check", codec=flightgroup.JSON,
        retention=flightgroup.Retention(success=300.0),
    )  # fmt: skip
    started, gate = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        gate.wait(10)
        return 2

    try:
        assert group.run_sync("kept", lambda: 1).value == 1
        thread = threading.Thread(target=lambda: group.run_sync("parked", slow))
        thread.start()
        assert started.wait(10)
        group.forget("parked")  # parks the running flight under its token
        gate.set()
        thread.join(10)
    finally:
        gate.set()
        group.close()
    client = redis_server.client()
    names = {name.decode() for name in client.scan_iter(match="fg:*", count=1000)}
    assert "fg:{ttl-check}:fence" in names
    assert any(":m:" in name for name in names)  # mailboxes
    assert any(name.startswith("fg:{ttl-check:") and name.endswith("}") for name in names)
    assert keys_without_ttl(client, "fg:*") == []
