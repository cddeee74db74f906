"""The fleet protocol in one process: the Lua scripts one by one against a real
redis-server (tests/redisproc.py), a model-based property test of random script
sequences, and the RedisArbiter through the public API: replies cut after Redis
acted (redis-py re-sends), an unreachable or frozen server, a 3-master Cluster, the
startup warning, ``status()`` and the number of round trips per call.

The multi-process scenarios are in tests/fleet/test_processes.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.exceptions import RedisClusterException, ResponseError

from flightgroup import (
    JSON,
    FlightGroup,
    LeaseLostError,
    Retention,
    UnavailableError,
    current_lease,
)
from flightgroup.redis import scripts
from flightgroup.redis.arbiter import RedisArbiter
from flightgroup.redis.names import Names
from flightgroup.redis.readers import LoopClients

from ..infleet import fleet_of, join_once
from ..redisproc import (
    CutProxy,
    RedisCluster,
    RedisServer,
    free_port,
    keys_without_ttl,
    refused_port,
)
from ..support import in_thread, once_reachable, scope_of, wait_until

LEASE_MS = 10_000
FENCE_TTL_MS = 86_400_000
GRACE_MS = 11_000
MAX_BYTES = 1024 * 1024
NO_FLIGHT_YET = 2**53


# -- the scripts, called directly ----------------------------------------------------


class Lua:
    """The scripts on one server and namespace; every call checks afterwards that
    no key of the namespace lacks a TTL."""

    def __init__(self, client: redis.Redis, namespace: str, cluster: bool = False) -> None:
        self.r = client
        self.ns = namespace
        self.cluster = cluster
        self.s = {name: client.register_script(body) for name, body in scripts.SCRIPTS.items()}
        self.calls = 0

    def names(self, key: str) -> Names:
        return Names(self.ns, key, self.cluster)

    def call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        reply = self.s[name](keys=keys, args=args)
        self.calls += 1
        self.assert_ttls(name)
        return reply

    def assert_ttls(self, after: str = "") -> None:
        bare = keys_without_ttl(self.r, f"fg:{{{self.ns}*")
        assert bare == [], f"keys without a TTL after {after}: {bare}"

    # one method per script, arguments as the arbiter sends them

    def acquire(
        self, key: str, nonce: str, min_token: int = 0, lease_ms: int = LEASE_MS,
        pid: int = 4242, host: str = "hostA",
    ) -> list[Any]:
        n = self.names(key)
        reply: list[Any] = self.call(
            "acquire", [n.record, n.fence],
            [nonce, lease_ms, FENCE_TTL_MS, min_token, pid, host, key],
        )
        return reply

    def complete(
        self, key: str, token: int, code: str = "ok", payload: bytes = b"v",
        retain_ms: int = 0, max_bytes: int = MAX_BYTES,
    ) -> list[Any]:
        n = self.names(key)
        reply: list[Any] = self.call(
            "complete", [n.record, n.parked(token), n.mailbox(token)],
            [token, code, payload, retain_ms, max(GRACE_MS, retain_ms + 1000), max_bytes],
        )
        return reply

    def abandon(self, key: str, token: int, reason: str = "gone") -> int:
        n = self.names(key)
        return int(self.call(
            "abandon", [n.record, n.parked(token), n.mailbox(token)], [token, GRACE_MS, reason]
        ))

    def check(self, key: str, token: int) -> list[Any]:
        n = self.names(key)
        reply: list[Any] = self.call(
            "check", [n.record, n.parked(token), n.mailbox(token)], [token]
        )
        return reply

    def renew(self, flights: list[tuple[str, int]], lease_ms: int = LEASE_MS) -> list[int]:
        keys: list[str] = []
        args: list[Any] = [lease_ms]
        for key, token in flights:
            n = self.names(key)
            keys += [n.record, n.parked(token)]
            args.append(token)
        return [int(x) for x in self.call("renew", keys, args)]

    def attempt(self, key: str, old: int, nonce: str) -> list[Any]:
        n = self.names(key)
        reply: list[Any] = self.call(
            "attempt", [n.record, n.parked(old), n.fence, n.mailbox(old)],
            [old, nonce, LEASE_MS, FENCE_TTL_MS, GRACE_MS],
        )
        return reply

    def forget(self, key: str) -> int:
        return int(self.call("forget", [self.names(key).record], []))

    def undo(self, key: str, nonce: str, reason: str = "no answer") -> int:
        return int(self.call("undo", [self.names(key).record], [nonce, GRACE_MS, reason]))

    # reading the state

    def record(self, key: str) -> dict[bytes, bytes]:
        return self.r.hgetall(self.names(key).record)  # type: ignore[return-value]

    def mailbox(self, key: str, token: int) -> list[Any]:
        return self.r.xrange(self.names(key).mailbox(token))  # type: ignore[return-value]


def fields(flat: list[Any]) -> dict[bytes, bytes]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


@pytest.fixture
def lua(redis_server: RedisServer, namespace: str) -> Lua:
    return Lua(redis_server.client(), namespace)


def test_acquire_lead_join_kept_and_fresh_wait(lua: Lua) -> None:
    lead = lua.acquire("k", "n1", pid=11, host="hostA")
    assert lead[0] == 1 and lead[2] == LEASE_MS
    t1 = int(lead[1])
    assert 0 < t1 < 2**53
    record = lua.record("k")
    assert record[b"t"] == str(t1).encode() and record[b"s"] == b"R" and record[b"o"] == b"n1"
    assert record[b"k"] == b"k" and record[b"p"] == b"11" and record[b"h"] == b"hostA"
    assert 0 < lua.r.pttl(lua.names("k").record) <= LEASE_MS

    join = lua.acquire("k", "n2")
    assert join[0] == 2 and int(join[1]) == t1 and 0 < join[2] <= LEASE_MS
    assert join[3] == b"11" and join[4] == b"hostA" and int(join[5]) >= 0
    assert lua.record("k")[b"j"] == b"1"

    # fresh: the running flight began before the call: wait for it, then ask from t1 + 1
    wait = lua.acquire("k", "n3", min_token=NO_FLIGHT_YET)
    assert wait[0] == 4 and int(wait[1]) == t1 and wait[2] > 0

    landed = lua.complete("k", t1, payload=b"V1", retain_ms=5000)
    assert landed[0] == 1 and int(landed[1]) == 1  # one joiner
    assert lua.record("k")[b"s"] == b"D"
    assert 4000 < lua.r.pttl(lua.names("k").record) <= 5000

    kept = lua.acquire("k", "n4")
    assert kept == [3, str(t1).encode(), b"ok", b"V1"]

    # the fresh caller asks again from t1 + 1: a kept outcome is not new enough; it leads
    fresh = lua.acquire("k", "n3", min_token=t1 + 1)
    assert fresh[0] == 1
    t2 = int(fresh[1])
    assert t2 > t1
    # a second fresh caller of that same wait joins the same new flight
    other = lua.acquire("k", "n5", min_token=t1 + 1)
    assert other[0] == 2 and int(other[1]) == t2
    # ... and so does a normal caller
    assert lua.acquire("k", "n6")[:2] == [2, str(t2).encode()]

    # a fresh call on an idle key leads at once
    alone = lua.acquire("idle", "n7", min_token=NO_FLIGHT_YET)
    assert alone[0] == 1 and int(alone[1]) > t2


def test_resent_acquire_leads_again_with_the_same_token(lua: Lua) -> None:
    first = lua.acquire("k", "nonce")
    again = lua.acquire("k", "nonce")  # the reply was lost; redis-py re-sent it
    assert first[0] == again[0] == 1 and first[1] == again[1]
    assert lua.record("k")[b"j"] == b"0"  # it did not join its own flight
    assert lua.acquire("k", "other")[:2] == [2, first[1]]
    # fresh, likewise: the re-sent fresh ACQUIRE is the leader, a new fresh caller waits
    f1 = lua.acquire("f", "fresh", min_token=NO_FLIGHT_YET)
    f2 = lua.acquire("f", "fresh", min_token=NO_FLIGHT_YET)
    assert f1[0] == f2[0] == 1 and f1[1] == f2[1]
    assert lua.acquire("f", "fresh2", min_token=NO_FLIGHT_YET)[:2] == [4, f1[1]]


@pytest.mark.parametrize("retain_ms", [0, 5000])
def test_complete_retried_after_success_lands_again_and_keeps_the_outcome(
    lua: Lua, retain_ms: int
) -> None:
    token = int(lua.acquire("k", "n1")[1])
    lua.acquire("k", "n2")
    landed = lua.complete("k", token, payload=b"first", retain_ms=retain_ms)
    assert [int(x) for x in landed] == [1, 1]
    entries = lua.mailbox("k", token)
    assert len(entries) == 1 and fields_of(entries[0]) == {b"c": b"ok", b"v": b"first"}
    for payload in (b"first", b"second"):  # a retry, and even a different payload
        again = lua.complete("k", token, payload=payload, retain_ms=retain_ms)
        assert int(again[0]) == 1
        assert lua.mailbox("k", token) == entries  # never replaced, still one entry
    if retain_ms:
        record = lua.record("k")
        assert record[b"s"] == b"D" and record[b"v"] == b"first"
        assert lua.acquire("k", "n3") == [3, str(token).encode(), b"ok", b"first"]
    else:
        assert lua.record("k") == {}
    assert lua.check("k", token)[0] == 1
    # an ABANDON after the landing changes nothing either
    assert lua.abandon("k", token) == 0
    assert lua.mailbox("k", token) == entries


def fields_of(entry: Any) -> dict[bytes, bytes]:
    return dict(entry[1])


def test_fenced_complete_writes_int_and_its_retry_stays_fenced(lua: Lua) -> None:
    t1 = int(lua.acquire("k", "n1")[1])
    lua.r.delete(lua.names("k").record)  # the lease ran out
    t2 = int(lua.acquire("k", "n2")[1])
    assert t2 > t1
    assert lua.complete("k", t1, payload=b"late") == [0]
    entries = lua.mailbox("k", t1)
    assert len(entries) == 1
    assert fields_of(entries[0])[b"c"] == b"int" and fields_of(entries[0])[b"f"] == b"1"
    assert lua.complete("k", t1, payload=b"late") == [0]  # the retry: still fenced
    assert lua.complete("k", t1, payload=b"late", retain_ms=5000) == [0]
    assert lua.mailbox("k", t1) == entries
    # the newer flight is untouched and lands normally
    record = lua.record("k")
    assert record[b"t"] == str(t2).encode() and record[b"s"] == b"R"
    assert int(lua.complete("k", t2)[0]) == 1
    # a landing with no record left at all (nobody took over) is fenced too
    t3 = int(lua.acquire("gone", "n3")[1])
    lua.r.delete(lua.names("gone").record)
    assert lua.complete("gone", t3) == [0]
    assert lua.check("gone", t3)[0] == 1  # its joiners read `int`


def test_complete_refuses_an_outcome_over_max_bytes(lua: Lua) -> None:
    token = int(lua.acquire("k", "n1")[1])
    with pytest.raises(ResponseError, match="max_value_bytes"):
        lua.complete("k", token, payload=b"x" * 11, max_bytes=10)
    assert lua.mailbox("k", token) == [] and lua.record("k")[b"s"] == b"R"


def test_abandon_never_overwrites_a_landing(lua: Lua) -> None:
    t1 = int(lua.acquire("a", "n1")[1])
    assert lua.abandon("a", t1, "withdrew") == 1
    entries = lua.mailbox("a", t1)
    assert len(entries) == 1
    assert fields_of(entries[0]) == {b"c": b"int", b"v": b"withdrew", b"f": b"1"}
    assert lua.record("a") == {}
    assert lua.abandon("a", t1, "again") == 0
    assert lua.complete("a", t1) == [0]  # the leader's late landing is fenced
    assert lua.mailbox("a", t1) == entries
    # kept outcome: ABANDON neither overwrites the mailbox nor drops the kept record
    t2 = int(lua.acquire("b", "n2")[1])
    lua.complete("b", t2, payload=b"kept", retain_ms=5000)
    assert lua.abandon("b", t2) == 0
    assert fields_of(lua.mailbox("b", t2)[0]) == {b"c": b"ok", b"v": b"kept"}
    assert lua.record("b")[b"s"] == b"D"


def test_renew_batch_answers_per_flight_and_extends_the_lease(lua: Lua) -> None:
    ta = int(lua.acquire("a", "na", lease_ms=1000)[1])
    tb = int(lua.acquire("b", "nb", lease_ms=1000)[1])
    tc = int(lua.acquire("c", "nc", lease_ms=1000)[1])
    td = int(lua.acquire("d", "nd", lease_ms=1000)[1])
    lua.r.delete(lua.names("b").record)  # b's lease ran out
    assert lua.forget("c") == 2  # c runs on, parked
    lua.complete("d", td, retain_ms=5000)  # d landed and is kept: no lease to renew
    assert lua.renew([("a", ta), ("b", tb), ("c", tc), ("d", td), ("a", ta + 1)], 30_000) == [
        1, 0, 2, 0, 0  # c: renewed, and parked
    ]
    assert 20_000 < lua.r.pttl(lua.names("a").record) <= 30_000
    assert 20_000 < lua.r.pttl(lua.names("c").parked(tc)) <= 30_000
    assert lua.r.pttl(lua.names("d").record) <= 5000
    assert not lua.r.exists(lua.names("b").record)  # RENEW never creates a record


def test_check_outcome_running_and_gone(lua: Lua) -> None:
    t1 = int(lua.acquire("k", "n1")[1])
    running = lua.check("k", t1)
    assert running[0] == 2 and 0 < running[1] <= LEASE_MS
    lua.complete("k", t1, payload=b"out", retain_ms=5000)
    landed = lua.check("k", t1)
    assert landed[0] == 1 and fields(landed[1])[b"c"] == b"ok"
    assert fields(landed[1])[b"v"] == b"out"
    # the mailbox gone, the kept record still answers
    lua.r.delete(lua.names("k").mailbox(t1))
    assert lua.check("k", t1) == [1, [b"c", b"ok", b"v", b"out"]]
    lua.r.delete(lua.names("k").record)
    assert lua.check("k", t1) == [0]
    # a token the record does not hold is not "running"
    t2 = int(lua.acquire("k", "n2")[1])
    assert lua.check("k", t2 - 1) == [0]
    assert lua.r.keys(f"fg:{{{lua.ns}*") is not None  # (CHECK is read-only: nothing new)
    assert not lua.r.exists(lua.names("k").mailbox(t2 - 1))


def test_attempt_moves_the_flight_to_a_new_token(lua: Lua) -> None:
    t1 = int(lua.acquire("k", "n1")[1])
    assert lua.acquire("k", "n2")[0] == 2
    moved = lua.attempt("k", t1, "n1")
    assert moved[0] == 1
    t2 = int(moved[1])
    assert t2 > t1
    record = lua.record("k")
    assert record[b"t"] == str(t2).encode() and record[b"a"] == b"2" and record[b"s"] == b"R"
    entries = lua.mailbox("k", t1)
    assert len(entries) == 1 and fields_of(entries[0]) == {b"c": b"next", b"v": str(t2).encode()}
    fence = lua.r.get(lua.names("k").fence)
    # the re-sent ATTEMPT answers the same new token and draws no other
    assert lua.attempt("k", t1, "n1") == [1, str(t2).encode()]
    assert lua.r.get(lua.names("k").fence) == fence
    assert lua.mailbox("k", t1) == entries
    assert lua.attempt("k", t1, "someone-else") == [0]
    # a joiner of t1 finds `next`, and the new token lands normally
    checked = lua.check("k", t1)
    assert checked[0] == 1 and fields(checked[1])[b"c"] == b"next"
    assert lua.check("k", t2)[0] == 2
    assert lua.renew([("k", t2), ("k", t1)]) == [1, 0]
    assert int(lua.complete("k", t2, payload=b"won")[0]) == 1
    assert fields_of(lua.mailbox("k", t2)[0])[b"v"] == b"won"
    # after the landing the old token's ATTEMPT is refused (the flight is over)
    assert lua.attempt("k", t1, "n1") == [0]
    # a lost flight: ATTEMPT refuses and writes nothing
    t3 = int(lua.acquire("lost", "n3")[1])
    lua.r.delete(lua.names("lost").record)
    assert lua.attempt("lost", t3, "n3") == [0]
    assert lua.mailbox("lost", t3) == []


def test_complete_of_a_token_a_retry_replaced_is_fenced(lua: Lua) -> None:
    t1 = int(lua.acquire("k", "n1")[1])
    t2 = int(lua.attempt("k", t1, "n1")[1])
    assert lua.complete("k", t1, payload=b"stale") == [0]
    assert fields_of(lua.mailbox("k", t1)[0])[b"c"] == b"next"
    assert lua.record("k")[b"t"] == str(t2).encode()


def test_forget_drops_a_kept_outcome_and_parks_a_running_flight(lua: Lua) -> None:
    assert lua.forget("nothing") == 0
    t0 = int(lua.acquire("kept", "n0")[1])
    lua.complete("kept", t0, retain_ms=5000)
    assert lua.forget("kept") == 1
    assert lua.record("kept") == {}
    assert lua.acquire("kept", "n0b")[0] == 1

    t1 = int(lua.acquire("k", "n1", lease_ms=3000)[1])
    assert lua.acquire("k", "n2")[0] == 2
    pttl = lua.r.pttl(lua.names("k").record)
    assert lua.forget("k") == 2
    parked = lua.names("k").parked(t1)
    assert lua.r.hget(parked, "t") == str(t1).encode()
    assert 0 < lua.r.pttl(parked) <= pttl  # the lease moved with it
    assert lua.record("k") == {}
    # Its joiners' processes read the notice beside its mailbox (ADR 0026).
    notice = lua.r.xrange(lua.names("k").notice(t1))
    assert [fields for _, fields in notice] == [{b"d": b"1"}]
    # a new call leads a new flight beside it
    t2 = int(lua.acquire("k", "n3")[1])
    assert t2 > t1
    # the old nonce (a re-sent ACQUIRE of the call that led t1): leads t1 again
    assert lua.acquire("k", "n1")[:2] == [1, str(t1).encode()]
    # the parked flight is still renewed (2: its leader learns it was parked), checked,
    # retried and landed by its token
    assert lua.renew([("k", t1), ("k", t2)], 20_000) == [2, 1]
    assert lua.r.pttl(parked) > 10_000
    assert lua.check("k", t1)[0] == 2
    t1b = int(lua.attempt("k", t1, "n1")[1])
    assert t1b > t2 and not lua.r.exists(parked)
    parked = lua.names("k").parked(t1b)
    assert lua.r.hget(parked, "t") == str(t1b).encode()
    assert lua.attempt("k", t1, "n1") == [1, str(t1b).encode()]  # re-sent
    assert lua.check("k", t1b)[0] == 2
    landed = lua.complete("k", t1b, payload=b"parked", retain_ms=5000)
    assert int(landed[0]) == 1
    assert not lua.r.exists(parked)  # a forgotten flight's outcome is not kept
    assert lua.check("k", t1b) == [1, [b"c", b"ok", b"v", b"parked"]]
    assert int(lua.complete("k", t1b, payload=b"parked")[0]) == 1  # its retry
    record = lua.record("k")
    assert record[b"t"] == str(t2).encode() and record[b"s"] == b"R"  # untouched
    assert int(lua.complete("k", t2, payload=b"new")[0]) == 1


def test_tokens_grow_across_keys_and_survive_the_loss_of_the_fence(lua: Lua) -> None:
    tokens = []  # in the order they were handed out, by ACQUIRE and ATTEMPT
    for i in range(30):
        key = f"k{i % 7}"
        nonce = uuid.uuid4().hex
        reply = lua.acquire(key, nonce)
        assert reply[0] == 1
        tokens.append(int(reply[1]))
        if i % 3 == 0:
            tokens.append(int(lua.attempt(key, tokens[-1], nonce)[1]))
        assert int(lua.complete(key, tokens[-1])[0]) == 1
    assert all(a < b for a, b in itertools.pairwise(tokens))
    fence = lua.names("k0").fence
    assert lua.r.get(fence) == str(tokens[-1]).encode()
    assert 0 < lua.r.ttl(fence) <= FENCE_TTL_MS // 1000
    lua.r.delete(fence)
    after = int(lua.acquire("k0", "n")[1])
    assert after > tokens[-1]  # seeded from the server's clock
    assert all(t < 2**53 for t in [*tokens, after])


def test_tokens_grow_across_a_restart_without_persistence() -> None:
    server = RedisServer()
    try:
        lua = Lua(server.client(), "ns")
        before = [int(lua.acquire(f"k{i}", "n")[1]) for i in range(5)]
        assert before == sorted(before) and len(set(before)) == 5
        server.restart()
        lua = Lua(server.client(), "ns")
        assert lua.r.dbsize() == 0
        after = int(lua.acquire("k0", "n")[1])
        assert after > before[-1] and after < 2**53
    finally:
        server.close()


# -- random script sequences against a reference model -------------------------------


@dataclass
class MFlight:
    """The model of one flight record (running or kept)."""

    token: int
    nonce: str
    state: str = "R"
    joiners: int = 0
    attempts: int = 1
    code: str = ""
    payload: bytes = b""


@dataclass
class Model:
    """What each script should answer, from the protocol's rules (not from the Lua)."""

    current: dict[str, MFlight] = field(default_factory=dict)  # the key's record
    parked: dict[tuple[str, int], MFlight] = field(default_factory=dict)
    mailbox: dict[tuple[str, int], tuple[str, bytes, bool]] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)  # every token handed out, in order
    known: dict[str, list[int]] = field(default_factory=dict)  # tokens seen per key
    # (key, the leading call's nonce) -> the token of the running flight FORGET parked
    forgot: dict[tuple[str, str], int] = field(default_factory=dict)

    def find(self, key: str, token: int) -> MFlight | None:
        flight = self.current.get(key)
        if flight is not None and flight.token == token:
            return flight
        return self.parked.get((key, token))

    def new_token(self, key: str, real: int) -> int:
        assert not self.tokens or real > self.tokens[-1], "tokens must strictly increase"
        assert real < 2**53
        self.tokens.append(real)
        self.known.setdefault(key, []).append(real)
        return real


KEYS = ["a", "b", "c"]
NONCES = ["n0", "n1", "n2", "n3", "n4"]


def step(lua: Lua, model: Model, data: st.DataObject) -> None:
    op = data.draw(st.sampled_from(
        ["acquire", "acquire", "complete", "abandon", "renew", "check", "attempt",
         "forget", "expire"]
    ))
    key = data.draw(st.sampled_from(KEYS))
    known = model.known.get(key, [])
    token_choice = st.sampled_from(known) if known else st.just(1)

    if op == "acquire":
        nonce = data.draw(st.sampled_from(NONCES))
        cur = model.current.get(key)
        min_kind = data.draw(st.sampled_from(["normal", "fresh", "next"]))
        min_token = {"normal": 0, "fresh": NO_FLIGHT_YET,
                     "next": (cur.token + 1) if cur else 0}[min_kind]
        reply = lua.acquire(key, nonce, min_token)
        kind, token = int(reply[0]), int(reply[1])
        parked = model.parked.get((key, model.forgot.get((key, nonce), 0)))
        if cur is not None and cur.state == "R" and cur.nonce == nonce:
            assert (kind, token) == (1, cur.token)  # its own flight: leads again
        elif parked is not None and parked.state == "R" and parked.nonce == nonce:
            # its own flight, parked by a FORGET since it led (a re-sent ACQUIRE),
            # whatever the key's record holds now
            assert (kind, token) == (1, parked.token)
        elif cur is not None and cur.token >= min_token:
            if cur.state == "D":
                assert reply == [3, str(cur.token).encode(), cur.code.encode(), cur.payload]
            else:
                assert (kind, token) == (2, cur.token)
                cur.joiners += 1
        elif cur is not None and cur.state == "R":
            assert (kind, token) == (4, cur.token)
        else:
            assert kind == 1
            model.current[key] = MFlight(model.new_token(key, token), nonce)

    elif op == "complete":
        token = data.draw(token_choice)
        retain = data.draw(st.sampled_from([0, 60_000]))
        payload = data.draw(st.sampled_from([b"x", b"y", b""]))
        code = data.draw(st.sampled_from(["ok", "err"]))
        reply = lua.complete(key, token, code, payload, retain)
        flight = model.find(key, token)
        box = model.mailbox.get((key, token))
        if flight is not None and flight.state == "D":
            assert [int(x) for x in reply] == [1, flight.joiners]
        elif flight is None or flight.state != "R":
            if box is not None:
                own_landing = not box[2] and box[0] != "next"
                assert [int(x) for x in reply][:1] == [1 if own_landing else 0]
            else:
                assert reply == [0]
                model.mailbox[(key, token)] = ("int", b"its leader lost its lease", True)
        else:
            assert [int(x) for x in reply] == [1, flight.joiners]
            model.mailbox[(key, token)] = (code, payload, False)
            if retain and model.current.get(key) is flight:
                flight.state, flight.code, flight.payload = "D", code, payload
            elif model.current.get(key) is flight:
                del model.current[key]
            else:
                del model.parked[(key, token)]

    elif op == "abandon":
        token = data.draw(token_choice)
        answer = lua.abandon(key, token, "abandoned")
        if (key, token) in model.mailbox:
            assert answer == 0
        else:
            assert answer == 1
            model.mailbox[(key, token)] = ("int", b"abandoned", True)
            flight = model.find(key, token)
            if flight is not None and flight.state == "R":
                if model.current.get(key) is flight:
                    del model.current[key]
                else:
                    del model.parked[(key, token)]

    elif op == "renew":
        batch = data.draw(st.lists(
            st.tuples(st.sampled_from(KEYS), st.integers(0, 20)), min_size=1, max_size=4
        ))
        flights = []
        for k, i in batch:
            ks = model.known.get(k, [])
            flights.append((k, ks[i % len(ks)] if ks else 1))
        answer = lua.renew(flights)
        expected = []
        for k, t in flights:
            f = model.find(k, t)
            if f is None or f.state != "R":
                expected.append(0)
            else:  # 2: renewed, and a FORGET parked it
                expected.append(1 if model.current.get(k) is f else 2)
        assert answer == expected

    elif op == "check":
        token = data.draw(token_choice)
        reply = lua.check(key, token)
        box = model.mailbox.get((key, token))
        flight = model.find(key, token)
        if box is not None:
            got = fields(reply[1])
            assert reply[0] == 1 and got[b"c"] == box[0].encode() and got[b"v"] == box[1]
        elif flight is not None and flight.state == "D":
            assert reply == [1, [b"c", flight.code.encode(), b"v", flight.payload]]
        elif flight is not None:
            assert reply[0] == 2 and reply[1] > 0
        else:
            assert reply == [0]

    elif op == "attempt":
        token = data.draw(token_choice)
        nonce = data.draw(st.sampled_from(NONCES))
        reply = lua.attempt(key, token, nonce)
        flight = model.find(key, token)
        box = model.mailbox.get((key, token))
        if flight is not None and flight.state == "R":
            assert int(reply[0]) == 1
            new = model.new_token(key, int(reply[1]))
            if model.current.get(key) is not flight:
                del model.parked[(key, token)]
                model.parked[(key, new)] = flight
            flight.token = new
            flight.attempts += 1
            model.mailbox[(key, token)] = ("next", str(new).encode(), False)
        elif box is not None and box[0] == "next":
            moved = model.find(key, int(box[1]))
            if moved is not None and moved.state == "R" and moved.nonce == nonce:
                assert reply == [1, box[1]]  # the re-sent ATTEMPT
            else:
                assert reply == [0]
        else:
            assert reply == [0]

    elif op == "forget":
        answer = lua.forget(key)
        cur = model.current.pop(key, None)
        if cur is None:
            assert answer == 0
        elif cur.state == "D":
            assert answer == 1
        else:
            assert answer == 2
            model.parked[(key, cur.token)] = cur
            model.forgot[(key, cur.nonce)] = cur.token

    else:  # expire: the record's TTL ran out (a lost lease, or the end of retention)
        cur = model.current.pop(key, None)
        lua.r.delete(lua.names(key).record)
        if cur is not None and data.draw(st.booleans()):  # or a parked one's
            for (k, t) in list(model.parked):
                if k == key:
                    del model.parked[(k, t)]
                    lua.r.delete(lua.names(k).parked(t))
                    break


def assert_state(lua: Lua, model: Model, entry_ids: dict[tuple[str, int], Any]) -> None:
    """Redis holds exactly the model's records and mailboxes; no mailbox entry was
    ever replaced; at most one running record per key; every key has a TTL."""
    for key in KEYS:
        record = lua.record(key)
        cur = model.current.get(key)
        if cur is None:
            assert record == {}
        else:
            assert record[b"t"] == str(cur.token).encode() and record[b"s"] == cur.state.encode()
            assert record[b"o"] == cur.nonce.encode() and record[b"a"] == str(cur.attempts).encode()
            assert int(record[b"j"]) == cur.joiners
            if cur.state == "D":
                assert record[b"c"] == cur.code.encode() and record[b"v"] == cur.payload
    parked = {
        (name.split(b"}")[0], int(name.rsplit(b":", 1)[1]))
        for name in lua.r.scan_iter(match=f"fg:{{{lua.ns}:*:x:*", count=1000)
    }
    assert len(parked) == len(model.parked)
    for (key, token), flight in model.parked.items():
        assert lua.r.hget(lua.names(key).parked(token), "t") == str(token).encode()
        assert flight.state == "R"
    boxes = list(lua.r.scan_iter(match=f"fg:{{{lua.ns}:*:m:*", count=1000))
    assert len(boxes) == len(model.mailbox)
    for (key, token), (code, payload, fenced) in model.mailbox.items():
        entries = lua.mailbox(key, token)
        assert len(entries) == 1
        got = fields_of(entries[0])
        assert got[b"c"] == code.encode() and got[b"v"] == payload
        assert (got.get(b"f") == b"1") == fenced
        first = entry_ids.setdefault((key, token), entries[0][0])
        assert entries[0][0] == first, "a mailbox entry was replaced"
    lua.assert_ttls("the step")


# 200 sequences of up to 25 steps, each step a round trip and a full state check: tens of
# seconds on a loaded machine, so the bound against a hang is wider than the default 60 s.
@pytest.mark.timeout(240)
@settings(
    max_examples=200, deadline=None, derandomize=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_script_sequences_follow_the_model(
    redis_server: RedisServer, data: st.DataObject
) -> None:
    lua = Lua(redis_server.client(), f"h{uuid.uuid4().hex[:10]}")
    model = Model()
    entry_ids: dict[tuple[str, int], Any] = {}
    try:
        for _ in range(data.draw(st.integers(1, 25))):
            step(lua, model, data)
            assert_state(lua, model, entry_ids)
    finally:
        for name in lua.r.scan_iter(match=f"fg:{{{lua.ns}*", count=1000):
            lua.r.delete(name)


# -- through the real client ----------------------------------------------------------


def joined_value(out: dict[str, Any]) -> Any:
    assert "error" not in out, out.get("error")
    return out["result"]


def never(*_: Any) -> Any:
    raise AssertionError("a joiner's work must not run")


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A Redis URL where nothing answers: every connection is refused."""
    with refused_port() as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[CutProxy]:
    p = CutProxy(redis_server.port)
    try:
        yield p
    finally:
        p.close()


@pytest.mark.timeout(30)
def test_a_retried_acquire_still_leads(
    redis_server: RedisServer, proxy: CutProxy, namespace: str
) -> None:
    key = f"cut-acquire-{uuid.uuid4().hex}"
    runs = []
    started, joined = threading.Event(), threading.Event()

    def work() -> str:
        runs.append(1)
        started.set()
        assert joined.wait(10)
        return "the value"

    with FlightGroup(redis=proxy.url, namespace=namespace, codec=JSON) as leader, \
            FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON) as other:
        leader.run_sync("warm-up", lambda: 0)  # scripts loaded: the next EVALSHA is the ACQUIRE
        proxy.arm(key.encode())  # ACQUIRE carries the raw key
        lead_thread, lead = in_thread(leader.run_sync, key, work, timeout=8)
        assert started.wait(8), lead
        assert proxy.cuts == 1  # Redis ran the ACQUIRE, its reply never came back
        join_thread, join = in_thread(other.run_sync, key, never, on_join=joined.set, timeout=8)
        lead_thread.join(10)
        join_thread.join(10)
        led, got = joined_value(lead), joined_value(join)
    assert runs == [1]
    assert led.value == "the value" and not led.joined
    assert got.value == "the value" and got.joined and got.token == led.token


@pytest.mark.timeout(30)
@pytest.mark.parametrize("retention", [None, Retention(success=5.0)])
def test_a_retried_landing_is_the_leaders_and_lands_once(
    redis_server: RedisServer, proxy: CutProxy, namespace: str, retention: Retention | None
) -> None:
    key = "landing"
    marker = f"landed-{uuid.uuid4().hex}"
    started, joined = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert joined.wait(10)
        return marker

    with FlightGroup(redis=proxy.url, namespace=namespace, codec=JSON,
                     retention=retention) as leader, \
            FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON) as other:
        proxy.arm(marker.encode())  # COMPLETE carries the encoded value
        lead_thread, lead = in_thread(leader.run_sync, key, work, timeout=8)
        assert started.wait(8), lead
        join_thread, join = in_thread(other.run_sync, key, never, on_join=joined.set, timeout=8)
        lead_thread.join(10)
        join_thread.join(10)
        led, got = joined_value(lead), joined_value(join)  # not LeaseLostError
        assert proxy.cuts == 1
        assert led.value == marker and not led.joined
        assert got.value == marker and got.joined and got.token == led.token
        client = redis_server.client()
        mailbox = Names(namespace, key, False).mailbox(led.token)
        assert client.xlen(mailbox) == 1
        if retention is not None:
            kept = other.run_sync(key, never)
            assert kept.value == marker and kept.joined and kept.token == led.token


@pytest.mark.timeout(30)
def test_unreachable_redis_raises_unavailable_error(refused_url: str) -> None:
    url = refused_url
    ran = []
    with FlightGroup(redis=url, namespace="n", codec=JSON) as group:
        with pytest.raises(UnavailableError) as caught:
            group.run_sync("k", lambda: ran.append(1))
        assert isinstance(caught.value.__cause__, redis.RedisError)

        async def work() -> int:
            ran.append(1)
            return 1

        with pytest.raises(UnavailableError) as caught_async:
            asyncio.run(group.run("user:7", work))
        assert isinstance(caught_async.value.__cause__, redis.RedisError)
        # Each call's error carries its key (docs/api.md: every error that concerns a key).
        assert (caught.value.key, caught_async.value.key) == ("k", "user:7")
        with pytest.raises(UnavailableError) as caught_forget:
            group.forget("k")
        assert isinstance(caught_forget.value.__cause__, redis.RedisError)
        # A call the scope could not serve is no flight, no join and no interruption
        # (docs/observability.md), and it is not timed as one.
        stats = group.stats()
        assert (stats.calls, stats.flights, stats.joins) == (2, 0, 0), stats
        assert (stats.interrupted, stats.failures, stats.in_flight) == (0, 0, 0), stats
        assert stats.flight_seconds_p99 == 0.0 and stats.joiners_max == 0, stats
    assert ran == []


def test_undo_ends_only_the_running_flight_its_nonce_led(lua: Lua) -> None:
    _, token = (int(x) for x in lua.acquire("k", "n1")[:2])
    assert lua.undo("k", "other") == 0 and lua.record("k")[b"t"] == str(token).encode()
    assert int(lua.acquire("k", "n2")[0]) == 2  # a call of the key joins it
    assert lua.undo("k", "n1", "never answered") == 1
    assert lua.record("k") == {}
    [(_, entry)] = lua.mailbox("k", token)  # its joiners hear at once
    assert entry == {b"c": b"int", b"v": b"never answered", b"f": b"1"}
    assert lua.undo("k", "n1") == 0  # a re-send acts on nothing
    assert int(lua.acquire("k", "n3")[0]) == 1  # the next call leads
    # Parked by a forget, it is found by its nonce; a landing is never overwritten.
    _, parked = (int(x) for x in lua.acquire("p", "n4")[:2])
    assert lua.forget("p") == 2
    lua.r.xadd(lua.names("p").mailbox(parked), {"c": "ok", "v": "landed"})
    lua.r.pexpire(lua.names("p").mailbox(parked), GRACE_MS)
    assert lua.undo("p", "n4") == 1
    assert lua.r.exists(lua.names("p").parked(parked)) == 0
    assert [e for _, e in lua.mailbox("p", parked)] == [{b"c": b"ok", b"v": b"landed"}]
    # Landed and kept: not running, nothing to undo.
    _, kept = (int(x) for x in lua.acquire("d", "n5")[:2])
    lua.complete("d", kept, retain_ms=60_000)
    assert lua.undo("d", "n5") == 0 and lua.record("d")[b"s"] == b"D"


@pytest.mark.timeout(60)
def test_calls_of_a_key_that_get_no_answer_share_one_undo() -> None:
    """A key has one undo task, which ends once Redis answered for the nonce of the call
    that got no answer; the calls refused meanwhile (Redis known out of reach) sent no
    ACQUIRE and add no nonce: never one task more (and its connection attempts) per
    failed call."""
    port = free_port()  # nothing listens there yet
    g = FlightGroup(redis=f"redis://127.0.0.1:{port}/0", namespace="undo", codec=JSON,
                    lease=2.0)
    server: RedisServer | None = None
    try:
        fleet = fleet_of(g)
        for _ in range(4):
            with pytest.raises(UnavailableError):
                g.run_sync("k", lambda: "never")
        undos = [t for t in fleet._background.tasks if t.get_coro().__name__ == "_undo"]  # type: ignore[union-attr]
        assert len(undos) == 1
        [(record, nonces)] = fleet._undo_nonces.items()
        assert record == Names("undo", "k", False).record and len(nonces) == 1
        server = RedisServer(port)  # Redis answers now: each nonce is undone, twice
        wait_until(lambda: not fleet._undoing and not fleet._undo_nonces, "the undo ended")
        assert all(t.done() for t in undos)
        got = once_reachable(lambda: g.run_sync("k", lambda: "led"))
        assert (got.value, got.joined) == ("led", False)
    finally:
        g.close()
        if server is not None:
            server.close()


@pytest.mark.timeout(60)
def test_an_acquire_a_frozen_server_ran_after_its_call_gave_up_is_undone() -> None:
    """Redis frozen (SIGSTOP): the calls give up (UnavailableError), but Redis runs
    their buffered ACQUIREs once it resumes, even from closed connections: flights
    nobody leads. The group undoes them (ADR 0024), so no later call joins one and
    gets FlightInterruptedError a lease later: its own next call of a key waits for
    that and leads; another group's call finds the key free."""
    server = RedisServer()
    ran: list[str] = []

    def work(name: str) -> Callable[[], str]:
        def body() -> str:
            ran.append(name)
            return name

        return body

    g = FlightGroup(redis=server.url, namespace="ghost", codec=JSON, lease=2.0)
    other = FlightGroup(redis=server.url, namespace="ghost", codec=JSON, lease=2.0)
    try:
        g.run_sync("warm-up", lambda: 0)
        other.run_sync("warm-up", lambda: 0)
        server.stop()
        try:
            calls = [in_thread(g.run_sync, key, work("never")) for key in ("k", "k2")]
            for thread, out in calls:
                thread.join(30)
                assert isinstance(out.get("error"), UnavailableError), out
        finally:
            server.cont()
        # Not FlightInterruptedError: its ghost flight was undone.
        got = once_reachable(lambda: g.run_sync("k", work("k")))
        assert (got.value, got.joined, ran) == ("k", False, ["k"])
        wait_until(lambda: not fleet_of(g)._undoing, "the undos end")
        client, names = server.client(), Names("ghost", "k2", False)
        assert client.exists(names.record) == 0
        mailboxes = client.keys(f"{names.record}:m:*")
        # k2's ACQUIRE ran only if it was sent before its call gave up (the breaker, or a
        # connection given up first, can stop it): one that ran was undone.
        assert len(mailboxes) <= 1
        for mailbox in mailboxes:
            [(_, entry)] = client.xrange(mailbox)
            assert entry[b"c"] == b"int" and entry[b"f"] == b"1"
        got = other.run_sync("k2", work("k2"))
        assert (got.value, got.joined, ran) == ("k2", False, ["k", "k2"])
    finally:
        g.close()
        other.close()
        server.close()


@pytest.mark.timeout(40)
def test_a_frozen_server_loses_the_leaders_lease() -> None:
    server = RedisServer()
    started, seen_lost = threading.Event(), threading.Event()
    lost_after: list[float] = []

    async def work() -> str:
        lease = current_lease()
        started.set()
        frozen = time.monotonic()
        await asyncio.wait_for(lease.wait_lost(), 20)
        lost_after.append(time.monotonic() - frozen)
        assert lease.lost
        seen_lost.set()
        return "too late"

    try:
        with FlightGroup(redis=server.url, namespace="n", codec=JSON, lease=0.6) as group:
            group.run_sync("warm-up", lambda: 0)
            thread, out = in_thread(lambda: asyncio.run(group.run("k", work)))
            assert started.wait(10)
            server.stop()
            try:
                assert seen_lost.wait(25)
            finally:
                server.cont()
            thread.join(20)
            assert isinstance(out.get("error"), LeaseLostError), out
        # a whole lease without a renewal loses it (not the client's retries of a
        # frozen socket: 4 tries x 5 s)
        assert lost_after[0] < 3.0, lost_after
    finally:
        server.close()


# -- a Redis Cluster ------------------------------------------------------------------


def slot_owners(cluster: RedisCluster) -> dict[int, int]:
    """slot -> the port of the master that serves it."""
    owners = {}
    for first, last, master, *_ in cluster.servers[0].client().execute_command("CLUSTER SLOTS"):
        for slot in range(first, last + 1):
            owners[slot] = int(master[1])
    return owners


@pytest.mark.timeout(60)
def test_cluster_runs_many_keys_from_two_groups(cluster: RedisCluster, namespace: str) -> None:
    keys = [f"key-{i}" for i in range(50)]
    runs: dict[str, int] = {}

    async def main(a: FlightGroup, b: FlightGroup) -> None:
        async def one(key: str) -> None:
            started, joined = asyncio.Event(), asyncio.Event()

            async def work() -> str:
                runs[key] = runs.get(key, 0) + 1
                started.set()
                await asyncio.wait_for(joined.wait(), 20)
                return f"value of {key}"

            lead = asyncio.create_task(a.run(key, work))
            await asyncio.wait_for(started.wait(), 20)
            join = await b.run(key, never, on_join=joined.set)
            led = await lead
            assert not led.joined and join.joined and join.token == led.token
            assert led.value == join.value == f"value of {key}"

        await asyncio.gather(*(one(key) for key in keys))
        # the outcomes are kept in all three masters
        kept = await asyncio.gather(*(b.run(key, never) for key in keys))
        assert all(r.joined and r.value == f"value of {k}" for r, k in zip(kept, keys, strict=True))
        # forget: the next call of the key runs again
        a.forget(keys[0])
        again = await b.run(keys[0], lambda: asyncio.sleep(0, "again"))
        assert again.value == "again" and not again.joined

    with FlightGroup(redis=cluster.url, namespace=namespace, codec=JSON, cluster=True,
                     retention=Retention(success=30.0)) as a, \
            FlightGroup(redis=cluster.url, namespace=namespace, codec=JSON, cluster=True) as b:
        asyncio.run(main(a, b))
    assert runs == dict.fromkeys(keys, 1)
    owners = slot_owners(cluster)
    used = {owners[int(cluster.servers[0].client().execute_command(
        "CLUSTER KEYSLOT", Names(namespace, key, True).record))] for key in keys}
    assert used == {s.port for s in cluster.servers}
    for server in cluster.servers:  # every master holds some of the records
        client = server.client()
        held = list(client.scan_iter(match=f"fg:{{{namespace}:*", count=1000))
        assert held, server.port
        assert keys_without_ttl(client, f"fg:{{{namespace}*") == []


@pytest.mark.timeout(60)
def test_cluster_status_and_lease_renewal(cluster: RedisCluster, namespace: str) -> None:
    started, joined = threading.Event(), threading.Event()
    lost = []

    def work() -> str:
        started.set()
        assert joined.wait(10)
        time.sleep(1.5)  # the work itself: longer than the lease
        lost.append(current_lease().lost)
        return "slow"

    with FlightGroup(redis=cluster.url, namespace=namespace, codec=JSON, cluster=True,
                     lease=0.6) as a, \
            FlightGroup(redis=cluster.url, namespace=namespace, codec=JSON, cluster=True,
                        lease=0.6) as b:
        assert scope_of(a) is not None
        lead_thread, lead = in_thread(a.run_sync, "slow", work)
        assert started.wait(10)
        join_thread, join = in_thread(b.run_sync, "slow", never, on_join=joined.set)
        assert joined.wait(10)
        flights = scope_of(a).status()
        assert [f["key"] for f in flights] == ["slow"] and flights[0]["leader_pid"] == os.getpid()
        lead_thread.join(10)
        join_thread.join(10)
        assert joined_value(lead).value == joined_value(join).value == "slow"
        assert joined_value(join).joined and lost == [False]
        assert scope_of(a).status() == []


# -- the startup warning, status(), round trips ----------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("policy", ["allkeys-lru", "noeviction"])
def test_startup_warns_when_redis_may_evict(
    caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    """The check runs beside the group's first calls, on its own thread: the group stays
    open until the server has answered it (and, when it warns, until the warning is in)."""
    server = RedisServer(None, "--maxmemory-policy", policy)
    client = server.client()

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records
                if r.name == "flightgroup" and "maxmemory-policy" in r.getMessage()]

    def asked() -> bool:
        stats = client.info("commandstats")
        return any(name.startswith("cmdstat_config") for name in stats)

    try:
        caplog.set_level(logging.WARNING, logger="flightgroup")
        with FlightGroup(redis=server.url, namespace="n", codec=JSON) as group:
            assert group.run_sync("k", lambda: 1).value == 1
            wait_until(asked, "the group asked the server's maxmemory-policy")
            if policy != "noeviction":
                wait_until(lambda: bool(warnings()), "the warning is logged")
        if policy == "noeviction":
            assert warnings() == []
        else:
            (warned,) = warnings()
            assert warned.levelno == logging.WARNING
            assert "allkeys-lru" in warned.getMessage()
    finally:
        client.close()
        server.close()


@pytest.mark.timeout(30)
def test_status_lists_running_flights_with_scan(redis_server: RedisServer, namespace: str) -> None:
    client = redis_server.client()
    release = threading.Event()
    started = {k: threading.Event() for k in ("s1", "s2", "s3")}
    joined = threading.Event()
    tokens: dict[str, int] = {}

    def work_of(key: str) -> Any:
        def work() -> str:
            tokens[key] = current_lease().token
            started[key].set()
            assert release.wait(10)
            return key
        return work

    with FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON,
                     retention=Retention(success=30.0)) as a, \
            FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON) as b:
        assert scope_of(a) is not None
        a.run_sync("kept", lambda: "kept")  # a kept outcome is no flight in progress
        assert scope_of(a).status() == []
        threads = [in_thread(a.run_sync, key, work_of(key)) for key in started]
        assert all(event.wait(10) for event in started.values())
        join_thread, join = in_thread(b.run_sync, "s2", never, on_join=joined.set)
        assert joined.wait(10)
        client.config_resetstat()
        flights = scope_of(a).status()
        stats = client.info("commandstats")
        assert "cmdstat_scan" in stats and "cmdstat_keys" not in stats
        assert sorted(f["key"] for f in flights) == ["s1", "s2", "s3"]
        assert [f["token"] for f in flights] == sorted(tokens.values())  # by token
        for flight in flights:
            assert set(flight) == {"key", "token", "leader_pid", "host", "joiners", "age_s"}
            assert flight["token"] == tokens[flight["key"]]
            assert flight["leader_pid"] == os.getpid()
            assert flight["host"] == socket.gethostname()
            assert flight["joiners"] == (1 if flight["key"] == "s2" else 0)
            assert isinstance(flight["age_s"], float) and 0 <= flight["age_s"] < 10
        assert len(scope_of(a).status(limit=2)) <= 2  # bounded
        assert scope_of(b) is not None  # any group of the namespace sees them
        ages = {"age_s"}
        assert [{k: v for k, v in f.items() if k not in ages} for f in scope_of(b).status()] == [
            {k: v for k, v in f.items() if k not in ages} for f in flights
        ]
        release.set()
        for thread, _ in threads:
            thread.join(10)
        join_thread.join(10)
        assert joined_value(join).value == "s2"
        assert scope_of(a).status() == []


class Counter:
    """Counts each arbiter's scripts and blocking reads (the round trips of a call)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple[Any, str, Any]] = []
        self.reading = threading.Event()
        self.loop_clients: dict[int, LoopClients] = {}  # id(client) -> who made it
        original_script = RedisArbiter._script
        original_xread = aioredis.Redis.xread
        original_client = LoopClients.client
        counter = self

        async def client(self: LoopClients, loop: asyncio.AbstractEventLoop) -> Any:
            made = await original_client(self, loop)
            counter.loop_clients[id(made)] = self
            return made

        async def script(self: RedisArbiter, name: str, keys: Any, args: Any) -> Any:
            reply = await original_script(self, name, keys, args)
            counter.log.append((self, name, reply))
            return reply

        async def xread(self: Any, *args: Any, **kwargs: Any) -> Any:
            counter.log.append((self, "xread", None))
            counter.reading.set()
            return await original_xread(self, *args, **kwargs)

        monkeypatch.setattr(RedisArbiter, "_script", script)
        monkeypatch.setattr(aioredis.Redis, "xread", xread)
        monkeypatch.setattr(LoopClients, "client", client)

    def of(self, group: FlightGroup) -> list[str]:
        """The requests of ``group``: its scripts, and the reads of its blocking client
        or of a client it made for a caller's loop."""
        arbiter = scope_of(group)
        assert isinstance(arbiter, RedisArbiter)
        return [
            name for who, name, _ in self.log
            if who is arbiter or who is arbiter._blocking
            or self.loop_clients.get(id(who)) is arbiter._readers
        ]

    def read_where(self, group: FlightGroup) -> list[str]:
        """Where each read of ``group`` was sent from: "the group's thread" (its blocking
        client) or "its loop" (a client it made for a caller's loop)."""
        arbiter = scope_of(group)
        assert isinstance(arbiter, RedisArbiter)
        return [
            "the group's thread" if who is arbiter._blocking else "its loop"
            for who, name, _ in self.log
            if name == "xread" and (
                who is arbiter._blocking or self.loop_clients.get(id(who)) is arbiter._readers
            )
        ]

    def replies(self, group: FlightGroup, name: str) -> list[Any]:
        return [reply for who, n, reply in self.log if who is scope_of(group) and n == name]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("joiner", ["thread", "task's first join", "task"])
def test_a_short_flight_takes_two_round_trips_per_caller(
    redis_server: RedisServer, namespace: str, monkeypatch: pytest.MonkeyPatch, joiner: str
) -> None:
    """A leader sends ACQUIRE and COMPLETE; a joiner ACQUIRE and one XREAD, whether it
    reads on the group's thread (a thread's call, and a loop's first join) or on its own
    loop (a task's, on a loop that joined before)."""
    started = threading.Event()
    with FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=3.0) as a, \
            FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON) as b, \
            asyncio.Runner() as runner:
        a.run_sync("warm-up-a", lambda: 0)  # each group's startup (script loads) is done
        b.run_sync("warm-up-b", lambda: 0)
        if joiner == "task":
            runner.run(join_once(a, b))  # (its loop's next join reads on it)
        counter = Counter(monkeypatch)

        def work() -> str:
            started.set()
            assert counter.reading.wait(10)  # the joiner reads before the landing
            return "v"

        lead_thread, lead = in_thread(a.run_sync, "k", work)
        assert started.wait(10)
        got = b.run_sync("k", never) if joiner == "thread" else runner.run(b.run("k", never))
        lead_thread.join(10)
        assert joined_value(lead).value == got.value == "v" and got.joined
        assert counter.of(a) == ["acquire", "complete"]
        assert counter.of(b) == ["acquire", "xread"]
        assert counter.read_where(b) == ["its loop" if joiner == "task" else "the group's thread"]


@pytest.mark.timeout(30)
def test_a_flight_longer_than_its_lease_is_renewed_for_its_joiner(
    redis_server: RedisServer, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, joined = threading.Event(), threading.Event()
    lost = []
    with FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=0.6) as a, \
            FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON,
                        lease=0.6) as b:
        a.run_sync("warm-up-a", lambda: 0)
        b.run_sync("warm-up-b", lambda: 0)
        counter = Counter(monkeypatch)

        def work() -> str:
            started.set()
            assert joined.wait(10)
            time.sleep(2.0)  # the work: more than three leases
            lost.append(current_lease().lost)
            return "long"

        lead_thread, lead = in_thread(a.run_sync, "k", work)
        assert started.wait(10)
        got = b.run_sync("k", never, on_join=joined.set)
        lead_thread.join(10)
        assert joined_value(lead).value == got.value == "long" and got.joined
        assert lost == [False]
        leader = counter.of(a)
        assert leader[0] == "acquire" and leader.count("complete") == 1
        # (the log is in reply order: one renewal sent as the work ended may answer
        # after the landing, and Redis may have run it after the landing too: 0)
        landed = leader.index("complete")
        assert leader[landed + 1:] in ([], ["renew"]), leader
        renews = counter.replies(a, "renew")[:leader[:landed].count("renew")]
        # The replies are logged as they come, over two connections: a renewal that
        # Redis ran just after the landing (0: its flight is no longer running) may be
        # heard just before the landing's reply (a loaded machine's scheduling).
        if renews and renews[-1] == [0]:
            renews = renews[:-1]
        assert len(renews) >= 5 and all(r == [1] for r in renews), renews  # every 0.2 s
        joiner = counter.of(b)
        assert joiner[0] == "acquire" and joiner[-1] == "xread"
        # the joiner reads until the lease it knows ends, asks CHECK (still running),
        # reads on: about one XREAD and one CHECK per lease, no more
        assert set(joiner[1:]) <= {"xread", "check"}
        checks = counter.replies(b, "check")
        assert 1 <= len(checks) <= 6 and all(int(c[0]) == 2 for c in checks), checks
        assert joiner.count("xread") <= len(checks) + 2, joiner


@pytest.mark.timeout(30)
def test_unreachable_cluster_raises_unavailable_error(refused_url: str) -> None:
    url = refused_url
    with FlightGroup(redis=url, namespace="n", codec=JSON, cluster=True) as group:
        # redis-py's Cluster client raises RedisClusterException (no RedisError):
        # the call must still end, as unavailable, not wait forever
        with pytest.raises(UnavailableError) as caught:
            group.run_sync("k", never, timeout=20)
        assert isinstance(caught.value.__cause__, (redis.RedisError, RedisClusterException))
        with pytest.raises(UnavailableError):
            group.forget("k")
        assert scope_of(group) is not None
        with pytest.raises(UnavailableError):
            scope_of(group).status()
