"""The libraries under test, each behind one shape.

``bind(fn)`` makes a fresh group (or cache) around ``fn`` and returns
``call(key)``: every measurement binds anew, so no round sees another round's
keys or cached values. Peers are imported inside ``bind``, so that a missing
one is only left out.
"""

from __future__ import annotations

import importlib.util
import itertools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from flightgroup import FlightGroup, Retention

Work = Callable[[], Coroutine[Any, Any, Any]]
AsyncCall = Callable[[str], Awaitable[Any]]
SyncWork = Callable[[], Any]
SyncCall = Callable[[str], Any]

W = TypeVar("W")
C = TypeVar("C")

FLIGHTGROUP = "flightgroup"
NO_COALESCING = "no coalescing"


@dataclass(frozen=True)
class Lib(Generic[W, C]):
    """A library as the scenarios see it."""

    name: str
    module: str  # what must be importable
    how: str  # how it is driven, for the report
    bind: Callable[[W], C]

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None


# -- async ---------------------------------------------------------------------


def _flightgroup(fn: Work) -> AsyncCall:
    from flightgroup import FlightGroup

    run = FlightGroup().run
    return lambda key: run(key, fn)


def _oneflight(fn: Work) -> AsyncCall:
    from oneflight import AsyncOneFlight

    do = AsyncOneFlight().do
    return lambda key: do(key, fn)


def _singleflight(fn: Work) -> AsyncCall:
    from singleflight.asynchronous import SingleFlightAsync

    call = SingleFlightAsync().call
    return lambda key: call(fn, key)


def _coalescer(fn: Work) -> AsyncCall:
    from coalescer import Coalescer

    do = Coalescer().do
    return lambda key: do(key, fn)


def _async_lru(fn: Work) -> AsyncCall:
    from async_lru import alru_cache

    # A fresh cache per bind, bounded above any scenario's key count: a miss is
    # a real miss, and no key of a running flight is evicted.
    @alru_cache(maxsize=4096)
    async def cached(key: str) -> Any:
        return await fn()

    return cached


_cashews_cache: Any = None
_cashews_binds = itertools.count()


def _cashews(fn: Work) -> AsyncCall:
    global _cashews_cache
    if _cashews_cache is None:
        from cashews import Cache

        _cashews_cache = Cache()
        # check_interval=0: no expiry sweep task in the loop that times the others.
        _cashews_cache.setup("mem://", check_interval=0)

    async def cached(key: str) -> Any:
        return await fn()

    # A prefix of its own per bind: the memory store is shared, a new bind must miss.
    prefix = f"b{next(_cashews_binds)}"
    wrapped: AsyncCall = _cashews_cache(ttl=60, key="{key}", prefix=prefix, lock=True)(cached)
    return wrapped


ASYNC_LIBS: tuple[Lib[Work, AsyncCall], ...] = (
    Lib(FLIGHTGROUP, "flightgroup", "`await FlightGroup().run(key, fn)`", _flightgroup),
    Lib("oneflight", "oneflight", "`await AsyncOneFlight().do(key, fn)`", _oneflight),
    Lib(
        "singleflight",
        "singleflight",
        "`await singleflight.asynchronous.SingleFlightAsync().call(fn, key)`",
        _singleflight,
    ),
    Lib("coalescer", "coalescer", "`await coalescer.Coalescer().do(key, fn)`", _coalescer),
    Lib(
        "async-lru",
        "async_lru",
        "`@alru_cache(maxsize=4096)` on `async def f(key): return await fn()`, a new cache "
        "per round (concurrent calls of the same args share one task; results stay cached)",
        _async_lru,
    ),
    Lib(
        "cashews",
        "cashews",
        '`Cache().setup("mem://", check_interval=0)`, `@cache(ttl=60, key="{key}", '
        "lock=True)` on `async def f(key)`, a new key prefix per round: the README's way to "
        "run concurrent identical calls once (`@cache.locked` alone runs each waiter after "
        "the lock frees; the in-process sharing comes from the decorator's default "
        "`protected=True` task sharing)",
        _cashews,
    ),
)

NONE_ASYNC: Lib[Work, AsyncCall] = Lib(
    NO_COALESCING, "asyncio", "each call awaits `fn()`", lambda fn: lambda key: fn()
)


# -- threads -------------------------------------------------------------------


def _flightgroup_sync(fn: SyncWork) -> SyncCall:
    from flightgroup import FlightGroup

    run_sync = FlightGroup().run_sync
    return lambda key: run_sync(key, fn)


def _oneflight_sync(fn: SyncWork) -> SyncCall:
    from oneflight import OneFlight

    do = OneFlight().do
    return lambda key: do(key, fn)


def _singleflight_sync(fn: SyncWork) -> SyncCall:
    from singleflight.basic import SingleFlight

    call = SingleFlight().call
    return lambda key: call(fn, key)


def _coalescer_sync(fn: SyncWork) -> SyncCall:
    from coalescer.sync import Coalescer

    do = Coalescer().do
    return lambda key: do(key, fn)


THREAD_LIBS: tuple[Lib[SyncWork, SyncCall], ...] = (
    Lib(FLIGHTGROUP, "flightgroup", "`FlightGroup().run_sync(key, fn)`", _flightgroup_sync),
    Lib("oneflight", "oneflight", "`oneflight.OneFlight().do(key, fn)`", _oneflight_sync),
    Lib(
        "singleflight",
        "singleflight",
        "`singleflight.basic.SingleFlight().call(fn, key)`",
        _singleflight_sync,
    ),
    Lib("coalescer", "coalescer", "`coalescer.sync.Coalescer().do(key, fn)`", _coalescer_sync),
)

NONE_SYNC: Lib[SyncWork, SyncCall] = Lib(
    NO_COALESCING, "threading", "each call runs `fn()`", lambda fn: lambda key: fn()
)


# -- (g) a kept outcome's yardstick ---------------------------------------------

TTLCACHE = "cachetools TTLCache + Lock"
TTLCACHE_HOW = (
    "`cachetools.TTLCache(maxsize=10_000, ttl=3600)` read behind a `threading.Lock`: "
    "`async def cached(key): with lock: return cache[key]`, awaited (the async twin), or the "
    "same body in a plain `def` (the sync twin); a new cache per round"
)


def ttlcache_installed() -> bool:
    return importlib.util.find_spec("cachetools") is not None


def ttlcache(key: str, value: Any) -> tuple[AsyncCall, SyncCall]:
    """A fresh ``TTLCache`` that holds ``value`` at ``key``, read behind a lock:
    ``async def cached(key)`` (one coroutine call, as ``await g.run`` pays) and its
    plain twin."""
    import cachetools

    cache: cachetools.TTLCache[str, Any] = cachetools.TTLCache(maxsize=10_000, ttl=3600)
    cache[key] = value
    lock = threading.Lock()

    async def cached(key: str) -> Any:
        with lock:
            return cache[key]

    def cached_sync(key: str) -> Any:
        with lock:
            return cache[key]

    return cached, cached_sync


# -- (h) the group's policies, configured ---------------------------------------

POLICY_NONE = "`FlightGroup()`"
POLICY_UNUSED = "every policy, nothing kept"
POLICY_KEPT = "every policy, every outcome kept"
HANDOVER_FLOOR = "floor: a hand-over to another thread and back"
POLICY_HOW = {
    POLICY_NONE: "`FlightGroup()`: no policy",
    POLICY_UNUSED: "`FlightGroup(deadline=60.0, retry=Retry(attempts=3), "
    "retention=Retention(success=None, error=None), limits=Limits(max_waiters=10_000, "
    "max_flights=1_000_000))`: every policy configured, none used by a miss that returns "
    "at once (no timeout, no retry, nothing kept, no limit reached)",
    POLICY_KEPT: "the same with `retention=Retention(success=60.0)` (the default max_items): "
    "every outcome is kept, and, the store being full, each evicts the least recently used",
    HANDOVER_FLOOR: "(sync only) no group: one kept thread, released through one lock, "
    "releases another that the caller waits on with a timeout, as a `run_sync` with a "
    "deadline hands its attempt over and waits for it (ADR 0038)",
}


def kept_retention() -> Retention:
    """(h)'s retention that keeps every outcome (its max_items is the default's)."""
    from flightgroup import Retention

    return Retention(success=60.0)


def policy_groups() -> dict[str, FlightGroup]:
    """One group per (h) variant, in the order of POLICY_HOW."""
    from flightgroup import FlightGroup, Limits, Retention, Retry

    def configured(retention: Retention) -> FlightGroup:
        return FlightGroup(
            deadline=60.0,
            retry=Retry(attempts=3),
            retention=retention,
            limits=Limits(max_waiters=10_000, max_flights=1_000_000),
        )

    return {
        POLICY_NONE: FlightGroup(),
        POLICY_UNUSED: configured(Retention(success=None, error=None)),
        POLICY_KEPT: configured(kept_retention()),
    }
