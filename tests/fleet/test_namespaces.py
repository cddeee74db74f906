"""Namespaces and keys in the fleet scope: a namespace that would break the hash tag is
refused; braces, glob characters and non-ASCII in keys and namespaces are one flight per
key, on a Cluster too; status() lists exactly its own namespace's flights.
"""

from __future__ import annotations

import hashlib
import threading
import uuid

import pytest

from flightgroup.redis.names import Names

from ..infleet import fleet_group, fleet_of, never
from ..infresh import held
from ..redisproc import RedisCluster, RedisServer, keys_without_ttl
from ..support import in_thread, outcome

pytestmark = pytest.mark.timeout(60)


def test_status_lists_only_the_flights_of_its_own_namespace(
    redis_server: RedisServer, namespace: str
) -> None:
    """status() lists only the flights of its own namespace, not of its prefixes' kin."""
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


@pytest.mark.parametrize("bad", ["}x", "a}b", "x}"])
def test_a_namespace_with_a_closing_brace_is_refused(redis_server: RedisServer, bad: str) -> None:
    """A namespace holding '}' is refused when the group is made, naming why.

    A '}' in the namespace would end the hash tag ``{ns:digest}`` of a flight's keys early: on a
    Cluster they would fall into different slots and every call would fail (CROSSSLOT)."""
    with pytest.raises(ValueError, match="namespace cannot hold '}'"):
        fleet_group(redis_server.url, bad)


def test_a_namespace_with_an_opening_brace_and_glob_characters_works_on_a_cluster(
    cluster: RedisCluster,
) -> None:
    """A namespace with '{' and glob characters works on a Cluster.

    "{", "*" and "[" in a namespace leave the hash tag whole (one slot per flight); two groups
    share one flight and status() finds it."""
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


def test_odd_keys_and_a_namespace_of_glob_characters(
    redis_server: RedisServer, namespace: str
) -> None:
    """Odd keys are one flight, and status() of a glob-character namespace is exact.

    A key with braces, glob characters and non-ASCII is one flight for two groups; status() of a
    namespace made of glob characters lists exactly its own flights (its SCAN pattern is
    escaped)."""
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
    assert Names(globby, key, False).record == f"fg:{{{globby}:{digest}}}"
    assert keys_without_ttl(redis_server.client(), "fg:*") == []
