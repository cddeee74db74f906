"""Retention in the fleet scope: kept failures, and the namespace's LRU index of kept
outcomes.

docs/api.md (Policies): retention is group-wide in every scope, and a kept outcome is served
"until its time runs out or it is evicted (LRU by items, then by encoded bytes; a hit
counts as a use)". COMPLETE keeps an index (``fg:{ns}:kept``: by use, by expiry, sizes)
in the same step that keeps an outcome and evicts the least recently used past
max_items, then max_bytes; ACQUIRE serving a kept outcome counts as a use; FORGET and a
fresh flight that replaces a kept outcome drop its member. On a Cluster only TTLs (and
the size-alone rule) apply (ADR 0021). The scripts are called first one by one, then
through groups.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from flightgroup import FlightFailedError, Retention
from flightgroup.directory import wire
from flightgroup.redis import scripts
from flightgroup.redis.names import Names

from ..infleet import fleet_group, never
from ..redisproc import RedisCluster, RedisServer, keys_without_ttl
from ..support import wait_until

pytestmark = pytest.mark.timeout(60)

LEASE_MS = 10_000
DAY_MS = 86_400_000
NO_FLIGHT_YET = 2**53


class Kept:
    """The scripts on one namespace, called with the index keys as the arbiter sends
    them (``index=False``: as a client without them, e.g. on a Cluster)."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.r = client
        self.ns = namespace
        self.s = {name: client.register_script(body) for name, body in scripts.SCRIPTS.items()}

    def n(self, key: str) -> Names:
        return Names(self.ns, key, False)

    def call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        reply = self.s[name](keys=keys, args=args)
        bare = keys_without_ttl(self.r, f"fg:{{{self.ns}*")
        assert bare == [], f"keys without a TTL after {name}: {bare}"
        return reply

    def acquire(self, key: str, nonce: str, min_token: int = 0, index: bool = True) -> Any:
        n = self.n(key)
        return self.call(
            "acquire", [n.record, n.fence, *(n.kept if index else [])],
            [nonce, LEASE_MS, DAY_MS, min_token, 1, "h", key],
        )

    def complete(
        self, key: str, token: int, payload: bytes = b"v", retain_ms: int = 60_000,
        size: int | None = None, max_items: int = 0, max_bytes: int = 0,
    ) -> Any:
        n = self.n(key)
        return self.call(
            "complete", [n.record, n.parked(token), n.mailbox(token), *n.kept],
            [token, "ok", payload, retain_ms, retain_ms + LEASE_MS, 1 << 20,
             len(payload) if size is None else size, max_items, max_bytes],
        )

    def keep(self, key: str, payload: bytes = b"v", **bounds: Any) -> int:
        """Lead ``key`` (a fresh call: a kept outcome of it is replaced) and keep it."""
        reply = self.acquire(key, f"n-{key}-{payload!r}", NO_FLIGHT_YET)
        assert int(reply[0]) == 1, reply
        token = int(reply[1])
        assert int(self.complete(key, token, payload, **bounds)[0]) == 1
        return token

    def forget(self, key: str) -> int:
        n = self.n(key)
        return int(self.call("forget", [n.record, n.forgot("f"), *n.kept], [60_000]))

    def served(self, key: str) -> bool:
        """An ACQUIRE of ``key`` is served a kept outcome (a use)."""
        reply = self.acquire(key, "reader")
        return int(reply[0]) == 3

    def members(self) -> list[bytes]:
        use = self.n("").kept[0]
        return list(self.r.zrange(use, 0, -1))  # type: ignore[union-attr]

    def total(self) -> int:
        return int(self.r.hget(self.n("").kept[2], "total") or 0)  # type: ignore[arg-type]

    def record(self, key: str) -> dict[bytes, bytes]:
        return self.r.hgetall(self.n(key).record)  # type: ignore[return-value]


@pytest.fixture
def kept(redis_server: RedisServer, namespace: str) -> Kept:
    return Kept(redis_server.client(), namespace)


# -- the scripts ----------------------------------------------------------------------


def test_complete_evicts_the_least_recently_used_past_max_items(kept: Kept) -> None:
    kept.keep("a", max_items=2)
    kept.keep("b", max_items=2)
    assert kept.served("a")  # a use: "b" is now the least recently used
    kept.keep("c", max_items=2)
    assert kept.record("b") == {} and not kept.served("b")
    assert kept.served("a") and kept.served("c")
    assert sorted(kept.members()) == sorted([kept.n("a").record.encode(),
                                             kept.n("c").record.encode()])
    assert kept.total() == 2


def test_complete_evicts_past_max_bytes_and_keeps_nothing_over_it_alone(kept: Kept) -> None:
    kept.keep("a", b"123456", max_bytes=10)
    kept.keep("b", b"abcdef", max_bytes=10)  # 12 bytes: "a" goes
    assert not kept.served("a") and kept.served("b")
    assert kept.total() == 6
    # over max_bytes alone: not kept, and the key's older kept outcome goes too
    kept.keep("b", b"x" * 11, max_bytes=10)
    assert kept.record("b") == {} and not kept.served("b")
    assert kept.members() == [] and kept.total() == 0


def test_a_failure_is_sized_by_its_type_module_and_message() -> None:
    from flightgroup.redis.outcomes import kept_bounds

    failure = wire.Failure("ValueError", "builtins", "é", 1.0, 5, 20)
    assert kept_bounds(failure) == (10 + 8 + 2, 5, 20)
    assert kept_bounds(wire.Value(b"abc", 1.0, 7, None)) == (3, 7, 0)
    assert kept_bounds(wire.Value(b"abc")) == (3, 0, 0)


def test_expired_members_are_purged_and_counted_no_more(kept: Kept) -> None:
    kept.keep("a", retain_ms=30, max_items=1)
    wait_until(lambda: kept.record("a") == {}, "a's kept outcome to expire")
    kept.keep("b", max_items=1)
    assert kept.members() == [kept.n("b").record.encode()] and kept.total() == 1


def test_sizes_left_by_an_index_that_expired_unevenly_count_nothing(kept: Kept) -> None:
    """The index's three keys expire together; sizes that outlived the other two (their
    expiries a millisecond apart, as Redis before 7 could set them) count nothing."""
    kept.keep("a", retain_ms=60_000, max_items=1)
    use, expiry, sizes = kept.n("").kept
    assert kept.r.pexpire(sizes, 120_000)  # the sizes outlive ...
    kept.r.delete(use, expiry)  # ... the members, as if those had expired first
    kept.keep("b", max_items=1)
    assert kept.members() == [kept.n("b").record.encode()] and kept.total() == 1
    ttls = [kept.r.pttl(k) for k in (use, expiry, sizes)]
    assert max(ttls) - min(ttls) <= 5 and min(ttls) > 0  # one deadline again


def test_forget_and_a_fresh_flight_drop_the_member(kept: Kept) -> None:
    kept.keep("a", b"aaa")
    kept.keep("b", b"bb")
    assert kept.forget("a") == 1
    assert kept.members() == [kept.n("b").record.encode()] and kept.total() == 2
    token = int(kept.acquire("b", "fresh", NO_FLIGHT_YET)[1])  # replaces b's kept outcome
    assert kept.members() == [] and kept.total() == 0
    assert int(kept.complete("b", token, b"b2", retain_ms=0)[0]) == 1  # not kept
    assert kept.members() == [] and kept.total() == 0


def test_a_landing_that_keeps_nothing_drops_a_member_whose_record_was_lost(
    kept: Kept,
) -> None:
    """A kept outcome's record gone behind the index's back (evicted under memory
    pressure, deleted by hand): the key's next flight, landed without keeping, drops
    it from the index, so its size no longer counts against max_bytes."""
    kept.keep("a", b"aaa")
    kept.keep("b", b"bb")
    kept.r.delete(kept.n("a").record)  # as maxmemory's eviction would
    token = int(kept.acquire("a", "after-eviction")[1])  # a new flight: nothing to replace
    assert len(kept.members()) == 2 and kept.total() == 5  # still listed
    assert int(kept.complete("a", token, b"a2", retain_ms=0)[0]) == 1
    assert kept.members() == [kept.n("b").record.encode()] and kept.total() == 2


def test_resent_completes_answer_as_the_first_did(kept: Kept) -> None:
    # kept, then re-sent: landed, counted once
    token = int(kept.acquire("a", "na")[1])
    assert int(kept.complete("a", token, b"aaa", max_items=1)[0]) == 1
    assert int(kept.complete("a", token, b"aaa", max_items=1)[0]) == 1
    assert kept.total() == 3 and len(kept.members()) == 1
    # evicted before the re-send reached Redis: still landed (its mailbox says so)
    kept.keep("b", max_items=1)
    assert kept.record("a") == {}
    assert int(kept.complete("a", token, b"aaa", max_items=1)[0]) == 1
    assert kept.record("a") == {} and kept.members() == [kept.n("b").record.encode()]
    # not kept (over max_bytes alone), re-sent: landed
    token = int(kept.acquire("c", "nc")[1])
    assert int(kept.complete("c", token, b"x" * 9, max_bytes=5)[0]) == 1
    assert int(kept.complete("c", token, b"x" * 9, max_bytes=5)[0]) == 1
    assert kept.record("c") == {} and kept.total() == 1


def test_an_eviction_never_deletes_a_running_flight(kept: Kept) -> None:
    """A member whose record runs a newer flight (its kept outcome replaced by a client
    that sent no index keys) is dropped from the index; the running record stays."""
    kept.keep("a")
    token = int(kept.acquire("a", "old-client", NO_FLIGHT_YET, index=False)[1])
    kept.keep("b", max_items=1)  # "a" is the least recently used member
    record = kept.record("a")
    assert record[b"s"] == b"R" and int(record[b"t"]) == token
    assert kept.members() == [kept.n("b").record.encode()] and kept.total() == 1


def test_a_client_without_the_index_keys_works_as_before(kept: Kept) -> None:
    """A caller that sends no index keys (a Cluster) keeps with TTLs only."""
    n = kept.n("a")
    token = int(kept.acquire("a", "n", index=False)[1])
    reply = kept.call(
        "complete", [n.record, n.parked(token), n.mailbox(token)],
        [token, "ok", b"v", 60_000, 70_000, 1 << 20],
    )
    assert int(reply[0]) == 1 and kept.record("a")[b"s"] == b"D"
    assert int(kept.acquire("a", "r", index=False)[0]) == 3
    assert kept.members() == []


# -- through groups ------------------------------------------------------------------


def test_two_groups_share_one_lru_and_a_hit_counts_as_a_use(
    redis_server: RedisServer, namespace: str
) -> None:
    retention = Retention(success=60.0, max_items=2)
    a = fleet_group(redis_server.url, namespace, retention=retention)
    b = fleet_group(redis_server.url, namespace, retention=retention)
    try:
        a.run_sync("x", lambda: "x")
        b.run_sync("y", lambda: "y")
        hit = b.run_sync("x", never)  # a use of "x": "y" is now the least recently used
        assert (hit.value, hit.joined) == ("x", True)
        a.run_sync("z", lambda: "z")  # three kept: "y" goes
        again = a.run_sync("y", lambda: "y2")
        assert (again.value, again.joined) == ("y2", False)
        assert b.run_sync("z", never).value == "z"
    finally:
        a.close()
        b.close()


def test_a_failure_over_max_bytes_alone_is_not_kept(
    redis_server: RedisServer, namespace: str
) -> None:
    # ValueError + builtins = 18 bytes: a message of 2 fits 20 bytes, one of 3 does not
    g = fleet_group(
        redis_server.url, namespace, retention=Retention(success=None, error=60.0, max_bytes=20)
    )

    def fail(message: str) -> Any:
        def work() -> None:
            raise ValueError(message)
        return work

    try:
        with pytest.raises(ValueError):
            g.run_sync("fits", fail("ab"))
        with pytest.raises(FlightFailedError):
            g.run_sync("fits", never)  # kept
        with pytest.raises(ValueError):
            g.run_sync("over", fail("abc"))
        assert g.run_sync("over", lambda: "ran").value == "ran"  # not kept
    finally:
        g.close()


def test_a_cluster_keeps_with_ttls_only_and_never_over_max_bytes_alone(
    cluster: RedisCluster, namespace: str
) -> None:
    """The documented limit (ADR 0021): no LRU index on a Cluster; the size-alone rule
    needs none and holds."""
    g = fleet_group(
        cluster.url, namespace, cluster=True,
        retention=Retention(success=60.0, max_items=1, max_bytes=10),
    )
    try:
        g.run_sync("a", lambda: 1)
        g.run_sync("b", lambda: 2)
        assert g.run_sync("a", never).joined  # both kept: TTLs only
        g.run_sync("big", lambda: "x" * 20)
        assert g.run_sync("big", lambda: "ran").value == "ran"
    finally:
        g.close()


def test_a_kept_failure_has_its_cause_in_the_leaders_process(
    redis_server: RedisServer, namespace: str
) -> None:
    """A kept failure has its __cause__ in the leader's process.

    docs/api.md, Policies: a kept failure raises FlightFailedError "(with ``__cause__`` in
    the leader's process), as a joiner's would". The process scope keeps it; the fleet
    scope's leader process gets the failure back from Redis as any other process."""
    g = fleet_group(
        redis_server.url, namespace, retention=Retention(success=None, error=30.0)
    )
    original = KeyError("missing")

    def boom() -> None:
        raise original

    try:
        with pytest.raises(KeyError):
            g.run_sync("k", boom)
        with pytest.raises(FlightFailedError) as caught:
            g.run_sync("k", never)
    finally:
        g.close()
    assert caught.value.error_type == "KeyError"
    assert caught.value.__cause__ is original
