"""Kept outcomes: the store behind ``Retention`` (TTL, LRU by items, then bytes).

A kept outcome lets a call that comes after a flight take the flight's outcome
without running the work, until its time runs out or it is evicted. The store
is a plain data structure: the engine holds its table lock around every call,
so nothing here locks, blocks, or runs user code (keys are hashed, as the
table hashes them anyway). ``estimate_size`` is the one exception: it calls a
value's ``__sizeof__``, so it is meant to be called outside the lock. ADR
0007 says why this is not ``cachetools``.

Layout:

- ``_entries``: key -> ``Kept``, an ``OrderedDict`` in LRU order (first is
  least recently used). A hit is ``move_to_end``; an eviction is
  ``popitem(last=False)``. A plain dict with pop-and-reinsert is as fast on a
  hit but leaves holes at its front, so finding the LRU entry scans them: about
  10x slower per eviction at 10,000 entries (measured on CPython 3.13).
- ``_heap``: ``(expires, seq, entry)`` records, one pushed per ``put``. Records
  are never removed when their entry leaves the store some other way (replaced,
  evicted, discarded, found expired by ``get``): they go stale, and are skipped
  when they reach the top. The heap is rebuilt from the live entries when stale
  records outnumber them, so it stays O(len(store)).

Invariants (code that keeps one says ``# Rn``):

R1  Removal is by identity. Expiry, purge and ``discard_if`` drop an entry only
    if ``_entries.get(entry.key) is entry``: a stale heap record, or an old timer
    of the engine, never drops a newer outcome of the same key. ``discard``
    (``forget``) drops whatever the key holds.
R2  ``bytes`` is the sum of ``size`` over ``_entries``; every removal goes
    through ``_take`` or ``_pop_lru``, which keep it.
R3  Every entry in ``_entries`` has exactly one record in ``_heap``; the heap
    holds at most ``2 * len(_entries) + _SLACK`` records after every call.
R4  An entry is live while ``clock() < expires``; from then on it is never
    served, and it leaves the store at the first ``get``, ``put`` or ``purge``
    that meets it.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from heapq import heapify, heappop, heappush
from itertools import count
from typing import Any

__all__ = ["Kept", "RetentionStore", "estimate_size"]

# Stale heap records tolerated beyond one per live entry before a rebuild: keeps
# small stores from rebuilding on every other put.
_SLACK = 32


class Kept:
    """One kept outcome. Identity matters: the engine holds on to the object it
    put, and ``discard_if`` drops the key only while the store holds that very
    object. Written once by ``RetentionStore.put``; read-only after."""

    __slots__ = ("expires", "key", "ok", "payload", "size", "token")

    key: Hashable  # the table key
    ok: bool  # True: a value, False: a failure
    payload: Any  # whatever the engine keeps: the value, the error, encoded bytes
    token: int  # fencing token of the flight that produced it
    expires: float  # the store's clock: served while clock() < expires
    size: int  # bytes counted against max_bytes

    def __init__(
        self, key: Hashable, ok: bool, payload: Any, token: int, expires: float, size: int
    ) -> None:
        self.key = key
        self.ok = ok
        self.payload = payload
        self.token = token
        self.expires = expires
        self.size = size

    def __repr__(self) -> str:
        return (
            f"Kept(key={self.key!r}, ok={self.ok}, token={self.token}, "
            f"expires={self.expires!r}, size={self.size})"
        )


class RetentionStore:
    """Kept outcomes of one group: per-entry TTL, LRU by items, then by bytes.

    Not thread-safe: every call must hold the group's table lock. No call
    blocks or runs user code. ``len()`` counts entries not yet purged, expired
    ones included; none of those is ever served (R4).
    """

    __slots__ = (
        "_bytes", "_clock", "_entries", "_heap", "_max_bytes", "_max_items", "_seq", "evicted",
    )

    def __init__(
        self,
        max_items: int,
        max_bytes: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise ValueError(f"max_items must be an int >= 1, got {max_items!r}")
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1
        ):
            raise ValueError(f"max_bytes must be None or an int >= 1, got {max_bytes!r}")
        self._max_items = max_items
        self.evicted = 0  # entries taken out by the item or byte bound (LRU), ever
        self._max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[Hashable, Kept] = OrderedDict()
        self._heap: list[tuple[float, int, Kept]] = []
        # Breaks ties of equal expiry times, so the heap never compares entries.
        self._seq = count()
        self._bytes = 0

    def get(self, key: Hashable) -> Kept | None:
        """The live entry of ``key``, made most recently used; or None.

        An expired entry found here is removed (R4) and None returned. The hot
        path: a hit is one dict lookup, one clock read and one ``move_to_end``.
        """
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() < entry.expires:
            self._entries.move_to_end(key)
            return entry
        # Found by key, so this is the key's own entry: no identity check needed.
        self._take(key)
        self._compact()
        return None

    def put(
        self,
        key: Hashable,
        ok: bool,
        payload: Any,
        token: int,
        ttl: float,
        size: int,
        bounds: tuple[int, int | None] | None = None,
    ) -> tuple[Kept | None, list[Kept]]:
        """Keep a new outcome of ``key`` for ``ttl`` seconds, as most recently used.

        Returns ``(entry, removed)``: the new entry, or None when its ``size``
        alone is over ``max_bytes`` (it is not kept); and every entry this call
        took out of the store, in the order it did: expired ones it met, the
        key's older entry (replaced by the new one, or dropped when the new one
        is not kept: a newer outcome exists, so the older one must not be
        served), then least recently used ones evicted until ``len <=
        max_items``, then until ``bytes <= max_bytes``. The new entry is never
        evicted by its own put. So ``len`` after = ``len`` before + (1 if kept)
        - ``len(removed)``. ``bounds``: (max_items, max_bytes) for this put
        instead of the store's (the policy of the flight that landed it).

        Raises ValueError for a ``ttl`` that is not > 0 (None or 0 means "do not
        keep": the engine does not call ``put`` then) or a negative ``size``.
        """
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0, got {ttl!r}")
        if size < 0:
            raise ValueError(f"size must not be negative, got {size!r}")
        now = self._clock()
        removed = self._expire(now)
        old = self._entries.get(key)
        if old is not None:
            self._take(key)
            removed.append(old)
        max_items, max_bytes = (self._max_items, self._max_bytes) if bounds is None else bounds
        if max_bytes is not None and size > max_bytes:
            self._compact()
            return None, removed
        entry = Kept(key, ok, payload, token, now + ttl, size)
        entries = self._entries
        entries[key] = entry  # a new key goes last: most recently used
        self._bytes += size
        heappush(self._heap, (entry.expires, next(self._seq), entry))  # R3
        # The new entry is last, and max_items >= 1, so it is never the one taken.
        while len(entries) > max_items:
            removed.append(self._pop_lru())
        if max_bytes is not None:
            # size <= max_bytes, so this stops before it reaches the new entry.
            while self._bytes > max_bytes:
                removed.append(self._pop_lru())
        self._compact()
        return entry, removed

    def discard(self, key: Hashable) -> Kept | None:
        """``forget(key)``: drop whatever ``key`` holds (expired or not) and
        return it; None if it held nothing."""
        if key not in self._entries:
            return None
        entry = self._take(key)
        self._compact()
        return entry

    def discard_if(self, entry: Kept) -> bool:
        """Drop ``entry`` only if the store still holds this very object for its
        key (R1); True if it did. An old timer or an old flight's cleanup calls
        this, so it can never drop a newer outcome of the same key."""
        if self._entries.get(entry.key) is not entry:
            return False
        self._take(entry.key)
        self._compact()
        return True

    def purge(self) -> int:
        """Drop every expired entry; return how many. O(1) when nothing has
        expired: one clock read and a look at the heap's top."""
        heap = self._heap
        if not heap:
            return 0
        now = self._clock()
        if heap[0][0] > now:
            return 0
        dropped = len(self._expire(now))
        self._compact()
        return dropped

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """The sum of ``size`` over the entries held (R2)."""
        return self._bytes

    @property
    def max_items(self) -> int:
        return self._max_items

    @property
    def max_bytes(self) -> int | None:
        return self._max_bytes

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._heap.clear()
        self._bytes = 0

    # -- internals --------------------------------------------------------

    def _take(self, key: Hashable) -> Kept:
        """Remove the entry of ``key`` (which must hold one). Its heap record
        goes stale (R3)."""
        entry = self._entries.pop(key)
        self._bytes -= entry.size  # R2
        return entry

    def _pop_lru(self) -> Kept:
        self.evicted += 1
        entry = self._entries.popitem(last=False)[1]
        self._bytes -= entry.size  # R2
        return entry

    def _expire(self, now: float) -> list[Kept]:
        """Pop the heap while its top has expired; remove the entries that are
        still the ones their key holds (R1). Returns them."""
        heap = self._heap
        expired: list[Kept] = []
        entries = self._entries
        while heap and heap[0][0] <= now:
            entry = heappop(heap)[2]
            if entries.get(entry.key) is entry:  # R1: a stale record is skipped
                self._take(entry.key)
                expired.append(entry)
        return expired

    def _compact(self) -> None:
        """Rebuild the heap from its live records once stale ones outnumber
        them (R3). Each rebuild costs O(records) and follows at least
        len + _SLACK removals since the last one, so it is O(1) amortized."""
        heap = self._heap
        entries = self._entries
        if len(heap) <= 2 * len(entries) + _SLACK:
            return
        live = [record for record in heap if entries.get(record[2].key) is record[2]]
        heapify(live)
        self._heap = live


# estimate_size bounds: how deep it looks into containers, and how many objects
# it visits in all, whatever the value.
_MAX_DEPTH = 4
_MAX_VISITS = 1_000


def estimate_size(value: object) -> int:
    """Estimate the bytes a value takes, for ``Retention.max_bytes`` in the
    process scope (where values are kept as they are, not encoded).

    - ``bytes``, ``bytearray``: exactly ``len(value)``; ``memoryview``: its
      ``nbytes``.
    - ``str``: exactly the length of its UTF-8 encoding (what a codec would
      write; lone surrogates count as 3 bytes each). An ASCII string is not
      encoded to find it.
    - ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` (subclasses too,
      e.g. a namedtuple or an OrderedDict, read through the base type so no
      overridden method runs): ``sys.getsizeof`` of the container plus the
      estimate of each item (of each key and value for a dict).
    - anything else: ``sys.getsizeof(value)``, which counts the object itself,
      not what it refers to (``object.__sizeof__`` if its ``__sizeof__``
      raises: an estimate never fails).

    It is bounded whatever the value: containers are looked into at most 4
    levels deep (a container deeper down counts as ``sys.getsizeof`` alone), and
    at most 1,000 objects are visited in all. A container whose items were not
    all visited counts the mean of the visited ones for each item it has, so a
    list of a million equal strings is estimated well after visiting a few
    hundred. An object referred to twice is counted twice; a reference cycle
    is cut by the depth bound. Not thread-safe against a container being
    changed while it is read: the items read so far are extrapolated.
    """
    budget = [_MAX_VISITS]
    return _estimate(value, 0, budget)


def _estimate(obj: Any, depth: int, budget: list[int]) -> int:
    budget[0] -= 1
    # Classified by type(obj), never isinstance: isinstance also trusts a
    # ``__class__`` an object claims (a mock with spec=str), and the base-type
    # methods below would raise on such an object.
    cls = type(obj)
    if issubclass(cls, str):
        if str.isascii(obj):  # O(1) for CPython's compact strings
            return str.__len__(obj)
        return len(str.encode(obj, "utf-8", "surrogatepass"))
    if issubclass(cls, bytes):
        return bytes.__len__(obj)
    if issubclass(cls, bytearray):
        return bytearray.__len__(obj)
    if cls is memoryview:  # not subclassable
        try:
            return int(obj.nbytes)
        except ValueError:  # released
            return _shallow(obj)
    size = _shallow(obj)
    if depth >= _MAX_DEPTH:
        return size
    pairs = False
    items: Any
    if issubclass(cls, dict):
        length, items, pairs = dict.__len__(obj), dict.items(obj), True
    elif issubclass(cls, list):
        length, items = list.__len__(obj), list.__iter__(obj)
    elif issubclass(cls, tuple):
        length, items = tuple.__len__(obj), tuple.__iter__(obj)
    elif issubclass(cls, set):
        length, items = set.__len__(obj), set.__iter__(obj)
    elif issubclass(cls, frozenset):
        length, items = frozenset.__len__(obj), frozenset.__iter__(obj)
    else:
        return size
    inner = 0
    seen = 0
    depth += 1
    try:
        for item in items:
            if budget[0] <= 0:
                break
            if pairs:
                inner += _estimate(item[0], depth, budget) + _estimate(item[1], depth, budget)
            else:
                inner += _estimate(item, depth, budget)
            seen += 1
    except RuntimeError:  # changed size during iteration (another thread): keep what was read
        pass
    if 0 < seen < length:
        inner = inner * length // seen
    return size + inner


def _shallow(obj: object) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:
        # A broken __sizeof__ must not fail the flight that keeps the value.
        return object.__sizeof__(obj)
