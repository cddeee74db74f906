"""RetentionStore and estimate_size: the store of kept outcomes, on a fake clock."""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Hashable
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
)

from flightgroup.retention import Kept, RetentionStore, estimate_size


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def store_of(
    max_items: int = 100, max_bytes: int | None = None
) -> tuple[RetentionStore, FakeClock]:
    clock = FakeClock()
    return RetentionStore(max_items, max_bytes, clock=clock), clock


def keep(store: RetentionStore, key: Hashable, ttl: float = 10.0, size: int = 1,
         ok: bool = True, token: int = 1) -> Kept:
    entry, _ = store.put(key, ok, f"payload-{key}", token, ttl, size)
    assert entry is not None
    return entry


def heap_records(store: RetentionStore) -> int:
    return len(store._heap)


# -- get ---------------------------------------------------------------------


def test_get_of_an_unknown_key_is_none() -> None:
    store, _ = store_of()
    assert store.get("a") is None
    assert len(store) == 0


def test_get_hit_returns_the_entry_put_with_its_fields() -> None:
    store, clock = store_of()
    entry, removed = store.put("a", False, "boom", 7, 5.0, 3)
    assert removed == []
    assert entry is not None
    assert store.get("a") is entry
    assert (entry.key, entry.ok, entry.payload, entry.token, entry.expires, entry.size) == (
        "a", False, "boom", 7, clock.now + 5.0, 3)
    assert len(store) == 1 and store.bytes == 3
    assert "key='a'" in repr(entry)


def test_entry_is_served_until_its_time_and_removed_by_the_get_that_finds_it_expired() -> None:
    store, clock = store_of()
    keep(store, "a", ttl=2.0, size=5)
    clock.advance(1.999)
    assert store.get("a") is not None
    clock.advance(0.001)  # clock() == expires: no longer live
    assert store.get("a") is None
    assert len(store) == 0 and store.bytes == 0
    assert store.purge() == 0  # its heap record is stale now, and skipped


def test_each_entry_has_its_own_ttl() -> None:
    store, clock = store_of()
    keep(store, "value", ttl=30.0, ok=True)
    keep(store, "error", ttl=1.0, ok=False)
    clock.advance(1.0)
    assert store.get("error") is None
    assert store.get("value") is not None


def test_an_infinite_ttl_never_expires() -> None:
    store, clock = store_of()
    entry = keep(store, "a", ttl=float("inf"))
    clock.advance(1e12)
    assert store.purge() == 0
    assert store.get("a") is entry


# -- put ---------------------------------------------------------------------


def test_put_replaces_the_keys_entry_and_reports_the_replaced_one() -> None:
    store, _ = store_of()
    old = keep(store, "a", size=4, token=1)
    new, removed = store.put("a", True, "v2", 2, 10.0, 6)
    assert removed == [old]
    assert new is not None and new is not old
    assert store.get("a") is new and new.token == 2
    assert len(store) == 1 and store.bytes == 6


def test_put_removes_expired_entries_it_meets_and_reports_them() -> None:
    store, clock = store_of()
    a = keep(store, "a", ttl=1.0, size=2)
    b = keep(store, "b", ttl=2.0, size=3)
    c = keep(store, "c", ttl=50.0, size=4)
    clock.advance(5.0)
    new, removed = store.put("d", True, None, 1, 10.0, 1)
    assert removed == [a, b]  # the order they expired in
    assert len(store) == 2 and store.bytes == c.size + 1
    assert new is not None and store.get("d") is new


@pytest.mark.parametrize("ttl", [0, 0.0, -1.0, float("nan")])
def test_put_refuses_a_ttl_that_is_not_positive(ttl: float) -> None:
    store, _ = store_of()
    with pytest.raises(ValueError, match="ttl"):
        store.put("a", True, None, 1, ttl, 1)
    assert len(store) == 0


def test_put_refuses_a_negative_size() -> None:
    store, _ = store_of()
    with pytest.raises(ValueError, match="size"):
        store.put("a", True, None, 1, 1.0, -1)


@pytest.mark.parametrize(("max_items", "max_bytes"), [(0, None), (1, 0), (True, None), (1.5, None),
                                                      (1, 2.0)])
def test_the_bounds_are_checked(max_items: Any, max_bytes: Any) -> None:
    with pytest.raises(ValueError, match="max_"):
        RetentionStore(max_items, max_bytes)


def test_the_default_clock_is_monotonic() -> None:
    store = RetentionStore(10, None)
    entry, _ = store.put("a", True, 1, 1, 60.0, 1)
    assert entry is not None
    assert time.monotonic() < entry.expires <= time.monotonic() + 60.0
    assert (store.max_items, store.max_bytes) == (10, None)


# -- LRU by items, then by bytes ---------------------------------------------


def test_max_items_evicts_the_least_recently_used_and_never_the_new_entry() -> None:
    store, _ = store_of(max_items=3)
    a, b, c = keep(store, "a"), keep(store, "b"), keep(store, "c")
    d, removed = store.put("d", True, None, 1, 10.0, 1)
    assert removed == [a]
    assert [store.get(k) for k in "bcd"] == [b, c, d]


def test_get_counts_as_a_use() -> None:
    store, _ = store_of(max_items=3)
    a, b, c = keep(store, "a"), keep(store, "b"), keep(store, "c")
    assert store.get("a") is a  # a is now the most recently used; b the least
    _, removed = store.put("d", True, None, 1, 10.0, 1)
    assert removed == [b]
    _, removed = store.put("e", True, None, 1, 10.0, 1)
    assert removed == [c]
    assert store.get("a") is a


def test_a_miss_and_a_replacement_are_not_uses_of_other_keys() -> None:
    store, _ = store_of(max_items=2)
    a = keep(store, "a")
    keep(store, "b")
    assert store.get("zzz") is None
    keep(store, "b")  # replacing b makes b the most recent, a stays the least
    _, removed = store.put("c", True, None, 1, 10.0, 1)
    assert removed == [a]


def test_max_items_of_one_keeps_only_the_newest() -> None:
    store, _ = store_of(max_items=1)
    a = keep(store, "a")
    b, removed = store.put("b", True, None, 1, 10.0, 1)
    assert removed == [a] and store.get("b") is b and len(store) == 1


def test_max_bytes_evicts_least_recently_used_until_under() -> None:
    store, _ = store_of(max_bytes=100)
    a = keep(store, "a", size=40)
    b = keep(store, "b", size=40)
    c = keep(store, "c", size=10)
    assert store.get("a") is a  # order now b, c, a
    d, removed = store.put("d", True, None, 1, 10.0, 55)
    assert removed == [b, c]  # 145 -> 105 -> 95 bytes: it stops as soon as it is under
    assert store.bytes == 95
    assert store.get("a") is a and store.get("d") is d


def test_items_are_bounded_first_then_bytes() -> None:
    store, _ = store_of(max_items=2, max_bytes=10)
    a = keep(store, "a", size=1)
    b = keep(store, "b", size=8)
    c, removed = store.put("c", True, None, 1, 10.0, 5)
    assert removed == [a, b]  # a for max_items, then b for max_bytes (8 + 5 > 10)
    assert len(store) == 1 and store.bytes == 5 and store.get("c") is c


def test_an_entry_of_exactly_max_bytes_is_kept_alone() -> None:
    store, _ = store_of(max_bytes=50)
    a, b = keep(store, "a", size=20), keep(store, "b", size=20)
    big, removed = store.put("big", True, None, 1, 10.0, 50)
    assert removed == [a, b]
    assert big is not None and store.get("big") is big and store.bytes == 50


def test_an_entry_larger_than_max_bytes_alone_is_not_kept_and_evicts_nothing_else() -> None:
    store, _ = store_of(max_bytes=50)
    a = keep(store, "a", size=20)
    b = keep(store, "b", size=20)
    entry, removed = store.put("huge", True, None, 1, 10.0, 51)
    assert entry is None and removed == []
    assert store.get("huge") is None
    assert store.get("a") is a and store.get("b") is b and store.bytes == 40


def test_an_oversize_new_outcome_still_drops_the_older_outcome_of_its_key() -> None:
    # A newer outcome exists: the older one must not be served in its place.
    store, _ = store_of(max_bytes=50)
    old = keep(store, "a", size=20)
    other = keep(store, "b", size=20)
    entry, removed = store.put("a", True, None, 2, 10.0, 51)
    assert entry is None and removed == [old]
    assert store.get("a") is None and store.get("b") is other and store.bytes == 20


def test_zero_size_entries_are_bounded_by_items_only() -> None:
    store, _ = store_of(max_items=3, max_bytes=1)
    for key in range(10):
        keep(store, key, size=0)
    assert len(store) == 3 and store.bytes == 0


# -- discard, discard_if: identity -------------------------------------------


def test_discard_drops_and_returns_what_the_key_held() -> None:
    store, clock = store_of()
    a = keep(store, "a", size=3)
    assert store.discard("a") is a
    assert store.discard("a") is None
    assert len(store) == 0 and store.bytes == 0
    b = keep(store, "b", ttl=1.0)
    clock.advance(5.0)
    assert store.discard("b") is b  # forget() drops an expired entry too


def test_discard_if_drops_only_the_entry_it_is_given() -> None:
    store, _ = store_of()
    old = keep(store, "a", token=1)
    new = keep(store, "a", token=2)
    assert store.discard_if(old) is False  # an old timer cannot drop the newer outcome
    assert store.get("a") is new
    assert store.discard_if(new) is True
    assert store.get("a") is None
    assert store.discard_if(new) is False


def test_discard_if_of_an_evicted_entry_does_not_touch_the_key_kept_again() -> None:
    store, _ = store_of(max_items=1)
    first = keep(store, "a")
    keep(store, "b")  # evicts first
    again = keep(store, "a")
    assert store.discard_if(first) is False
    assert store.get("a") is again


# -- purge and the heap ------------------------------------------------------


def test_purge_drops_expired_entries_and_counts_them() -> None:
    store, clock = store_of()
    keep(store, "a", ttl=1.0, size=2)
    keep(store, "b", ttl=2.0, size=2)
    c = keep(store, "c", ttl=3.0, size=2)
    assert store.purge() == 0
    clock.advance(2.0)
    assert store.purge() == 2
    assert len(store) == 1 and store.bytes == 2 and store.get("c") is c
    assert store.purge() == 0


def test_purge_skips_stale_heap_records_of_a_replaced_key() -> None:
    store, clock = store_of()
    keep(store, "a", ttl=1.0, token=1)
    newer = keep(store, "a", ttl=100.0, token=2)
    clock.advance(2.0)  # the record of the first outcome is due
    assert store.purge() == 0
    assert store.get("a") is newer


def test_purge_skips_stale_records_of_discarded_and_evicted_entries() -> None:
    store, clock = store_of(max_items=2)
    keep(store, "a", ttl=1.0)
    store.discard("a")
    newer_a = keep(store, "a", ttl=100.0)
    keep(store, "b", ttl=1.0)
    keep(store, "c", ttl=100.0)  # evicts a
    newest_a = keep(store, "a", ttl=100.0)  # evicts b
    clock.advance(10.0)
    assert store.purge() == 0
    assert store.get("a") is newest_a and newest_a is not newer_a


def test_heap_stays_bounded_when_one_key_is_put_again_and_again() -> None:
    store, _ = store_of()
    for token in range(10_000):
        keep(store, "a", ttl=3600.0, token=token)
        assert heap_records(store) <= 2 * len(store) + 32
    assert len(store) == 1
    assert store.get("a") is not None and store.get("a").token == 9_999  # type: ignore[union-attr]


def test_heap_stays_bounded_under_discards_and_evictions() -> None:
    store, _ = store_of(max_items=50)
    for i in range(5_000):
        keep(store, i % 200, ttl=3600.0)
        if i % 3 == 0:
            store.discard((i * 7) % 200)
        assert heap_records(store) <= 2 * len(store) + 32


def test_heap_stays_bounded_when_gets_find_entries_expired() -> None:
    store, clock = store_of()
    for i in range(200):
        keep(store, i, ttl=1.0)
    keep(store, "long", ttl=1e9)
    clock.advance(2.0)
    for i in range(200):
        assert store.get(i) is None
    assert len(store) == 1 and heap_records(store) <= 2 * len(store) + 32


def test_clear_drops_everything() -> None:
    store, clock = store_of()
    for i in range(5):
        keep(store, i, ttl=1.0, size=3)
    store.clear()
    assert len(store) == 0 and store.bytes == 0 and heap_records(store) == 0
    clock.advance(2.0)
    assert store.purge() == 0
    assert keep(store, 1) is store.get(1)


# -- the store against a reference model ---------------------------------------


class Model:
    """The obvious store: a dict of entries, an explicit LRU list, expiry times."""

    def __init__(self, max_items: int, max_bytes: int | None) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.entries: dict[Hashable, Kept] = {}
        self.lru: list[Hashable] = []  # least recently used first

    def _drop(self, key: Hashable) -> Kept:
        self.lru.remove(key)
        return self.entries.pop(key)

    def expire(self, now: float) -> set[int]:
        gone = [key for key, entry in self.entries.items() if entry.expires <= now]
        return {id(self._drop(key)) for key in gone}

    def get(self, key: Hashable, now: float) -> Kept | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            self._drop(key)
            return None
        self.lru.remove(key)
        self.lru.append(key)
        return entry

    def put(self, key: Hashable, entry: Kept | None, size: int,
            now: float) -> tuple[set[int], list[Kept]]:
        """Mirror a put; ``entry`` is the store's new object (None: not kept)."""
        expired = self.expire(now)
        rest: list[Kept] = []
        if key in self.entries:
            rest.append(self._drop(key))
        if self.max_bytes is not None and size > self.max_bytes:
            assert entry is None
            return expired, rest
        assert entry is not None
        self.entries[key] = entry
        self.lru.append(key)
        while len(self.entries) > self.max_items:
            rest.append(self._drop(self.lru[0]))
        while self.max_bytes is not None and self.bytes > self.max_bytes:
            rest.append(self._drop(self.lru[0]))
        return expired, rest

    @property
    def bytes(self) -> int:
        return sum(entry.size for entry in self.entries.values())


KEYS = st.sampled_from(["a", "b", "c", "d", "e", 1, 2])
TTLS = st.sampled_from([0.5, 1.0, 2.0, 3.0, 10.0, float("inf")])
SIZES = st.integers(min_value=0, max_value=40)


class StoreMachine(RuleBasedStateMachine):
    handed = Bundle("handed")  # entries put returned: old ones feed discard_if

    @initialize(max_items=st.integers(min_value=1, max_value=5),
                max_bytes=st.one_of(st.none(), st.integers(min_value=1, max_value=80)))
    def start(self, max_items: int, max_bytes: int | None) -> None:
        self.clock = FakeClock()
        self.store = RetentionStore(max_items, max_bytes, clock=self.clock)
        self.model = Model(max_items, max_bytes)
        self.token = 0

    @rule(target=handed, key=KEYS, ok=st.booleans(), ttl=TTLS, size=SIZES)
    def put(self, key: Hashable, ok: bool, ttl: float, size: int) -> Any:
        self.token += 1
        entry, removed = self.store.put(key, ok, object(), self.token, ttl, size)
        if entry is not None:
            assert (entry.key, entry.ok, entry.token, entry.size) == (key, ok, self.token, size)
            assert entry.expires == self.clock.now + ttl
        expired, rest = self.model.put(key, entry, size, self.clock.now)
        head = removed[: len(expired)]
        assert {id(e) for e in head} == expired
        assert [id(e) for e in removed[len(expired):]] == [id(e) for e in rest]
        return multiple(entry) if entry is not None else multiple()

    @rule(key=KEYS)
    def get(self, key: Hashable) -> None:
        assert self.store.get(key) is self.model.get(key, self.clock.now)

    @rule(key=KEYS)
    def discard(self, key: Hashable) -> None:
        expected = self.model._drop(key) if key in self.model.entries else None
        assert self.store.discard(key) is expected

    @rule(entry=handed)
    def discard_if(self, entry: Kept) -> None:
        holds = self.model.entries.get(entry.key) is entry
        if holds:
            self.model._drop(entry.key)
        assert self.store.discard_if(entry) is holds

    @rule()
    def purge(self) -> None:
        assert self.store.purge() == len(self.model.expire(self.clock.now))

    @rule(seconds=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5, 100.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def clear(self) -> None:
        self.store.clear()
        self.model.entries.clear()
        self.model.lru.clear()

    @invariant()
    def same_contents(self) -> None:
        assert len(self.store) == len(self.model.entries)
        assert self.store.bytes == self.model.bytes
        assert list(self.store._entries) == self.model.lru  # same LRU order
        assert all(self.store._entries[k] is e for k, e in self.model.entries.items())
        assert len(self.store._heap) <= 2 * len(self.store) + 32


StoreMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_store_matches_the_reference_model = StoreMachine.TestCase


# -- estimate_size -------------------------------------------------------------


def test_estimate_of_bytes_and_strings_is_exact() -> None:
    assert estimate_size(b"") == 0
    assert estimate_size(b"abc") == 3
    assert estimate_size(bytearray(1000)) == 1000
    assert estimate_size(memoryview(b"x" * 64)[8:]) == 56
    assert estimate_size("hello") == 5
    assert estimate_size("é") == 2
    assert estimate_size("日本") == 6
    assert estimate_size("🙂") == 4
    assert estimate_size("\ud800") == 3  # a lone surrogate does not fail the estimate


def test_estimate_of_other_objects_is_getsizeof() -> None:
    for value in (None, 12, 2**200, 1.5, object(), Kept("k", True, None, 1, 0.0, 0)):
        assert estimate_size(value) == sys.getsizeof(value)
    released = memoryview(b"abc")
    released.release()
    assert estimate_size(released) == sys.getsizeof(released)


def test_estimate_of_containers_adds_their_items() -> None:
    items = [b"ab", "cde", 7]
    expected_items = 2 + 3 + sys.getsizeof(7)
    assert estimate_size(items) == sys.getsizeof(items) + expected_items
    assert estimate_size(tuple(items)) == sys.getsizeof(tuple(items)) + expected_items
    assert estimate_size(set(items)) == sys.getsizeof(set(items)) + expected_items
    assert estimate_size(frozenset(items)) == sys.getsizeof(frozenset(items)) + expected_items
    mapping = {"k": b"1234", "é": [b"x"]}
    assert estimate_size(mapping) == (
        sys.getsizeof(mapping) + 1 + 4 + 2 + sys.getsizeof(mapping["é"]) + 1)


def test_estimate_reads_subclasses_through_their_base_type() -> None:
    Point = collections.namedtuple("Point", "x y")
    point = Point(b"ab", b"cd")
    assert estimate_size(point) == sys.getsizeof(point) + 4

    class Sneaky(dict[str, bytes]):
        def items(self) -> Any:
            raise AssertionError("user code ran")

        def __iter__(self) -> Any:
            raise AssertionError("user code ran")

        def __len__(self) -> int:
            raise AssertionError("user code ran")

    sneaky = Sneaky(a=b"123")
    assert estimate_size(sneaky) == sys.getsizeof(sneaky) + 1 + 3
    assert estimate_size(collections.OrderedDict(a=b"12")) > 3


def test_estimate_does_not_trust_a_claimed_class_and_survives_a_broken_sizeof() -> None:
    fake_str = mock.Mock(spec=str)
    assert estimate_size(fake_str) > 0

    class Broken:
        def __sizeof__(self) -> int:
            raise RuntimeError("no")

    assert estimate_size(Broken()) == object.__sizeof__(Broken())
    assert estimate_size([Broken()]) > 0


def test_estimate_looks_at_most_four_levels_deep_and_cuts_cycles() -> None:
    deepest = [b"x" * 1000]
    nested: list[Any] = deepest
    for _ in range(4):
        nested = [nested]
    # levels 0..3 are looked into; the list at level 4 counts as getsizeof alone
    assert estimate_size(nested) == 4 * sys.getsizeof([None]) + sys.getsizeof(deepest)
    cycle: list[Any] = [b"ab"]
    cycle.append(cycle)
    assert estimate_size(cycle) < 10 * sys.getsizeof(cycle) + 10


class Counted:
    visits = 0

    def __sizeof__(self) -> int:
        Counted.visits += 1
        return 100


def test_estimate_visits_at_most_about_a_thousand_objects() -> None:
    each = sys.getsizeof(Counted())  # __sizeof__ plus the GC header
    Counted.visits = 0
    huge = [Counted() for _ in range(100_000)]
    started = time.perf_counter()
    estimate = estimate_size(huge)
    assert time.perf_counter() - started < 0.5
    assert Counted.visits <= 1_000
    # the unvisited items are counted as the mean of the visited ones
    assert estimate == sys.getsizeof(huge) + 100_000 * each

    Counted.visits = 0
    wide_and_deep = [[[[Counted() for _ in range(30)] for _ in range(30)]
                      for _ in range(30)] for _ in range(30)]  # 810,000 leaves
    estimate_size(wide_and_deep)
    assert Counted.visits <= 1_000


def test_estimate_of_a_huge_list_of_strings_is_close() -> None:
    words = ["word-%07d" % i for i in range(1_000_000)]  # noqa: UP031
    truth = sys.getsizeof(words) + sum(len(w) for w in words)
    started = time.perf_counter()
    estimate = estimate_size(words)
    assert time.perf_counter() - started < 0.5
    assert estimate == truth  # every word has the same length: the mean is exact
    mixed = [b"x" * (i % 100) for i in range(100_000)]
    truth = sys.getsizeof(mixed) + sum(len(b) for b in mixed)
    assert abs(estimate_size(mixed) - truth) <= truth * 0.05
