"""One key's flight, and the table of flights of one group.

States and edges (every change goes through ``Flight._move``, except ``settle``'s
move to DONE, which comes from RUNNING, RETRY_PENDING or SETTLING and is guarded
by I2)::

    IDLE ──► RUNNING ──► DONE
     │          │  ▲
     │          ▼  │
     │      RETRY_PENDING          (a failed attempt waits for its next one)
     │          │
     └──────────┴────► DONE        (an unclaimed IDLE flight is abandoned;
                                    a retry that is given up settles)
    RUNNING ──► SETTLING ──► DONE   (the wide scopes: a landing handed to
                                    the coordinator or Redis, not yet acknowledged; the
                                    process scope settles in one step)

An IDLE flight is in the table but has no leader yet: the flight that follows
one that had ``fresh`` callers waiting for its end. Its ``claims`` counts the
callers that were told to lead or join it; the first caller that reaches it
while it is IDLE leads it.

Invariants (code that keeps one says ``# In``):

I1  The table holds at most one flight per key, and removal is by identity:
    ``if flights.get(key) is flight: del flights[key]``. ``forget`` may remove
    outright; a flight's own settling never removes a newer flight.
I2  A flight settles at most once; the first outcome wins, a late one is dropped.
I3  Every waiter registered on a flight is handed exactly one signal, or is
    withdrawn by its own caller under the lock; never both, never neither.
    Signals are decided under the lock and delivered after it is released.
I4  An IDLE flight without a leader always has a pending claim (``claims > 0``);
    when the last claimant withdraws, the flight leaves the table.
I5  User work, codecs and wake-ups never run under the table lock.
I6  A caller that already waits on a flight never joins it again: a work that
    calls its own key (directly or through other keys) gets RuntimeError.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from _thread import LockType, allocate_lock
from asyncio import events
from collections.abc import Hashable
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Generic, NamedTuple, TypeVar

from ._log import log
from .errors import GroupClosedError, TooManyFlightsError, TooManyWaitersError
from .lease import Lease
from .policy import NO_POLICY, FlightPolicy
from .retention import RetentionStore
from .stats import Recorder

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from .policy import Retention
    from .scope.causes import KeptCauses

__all__ = [
    "Attempt",
    "Flight",
    "FlightTable",
    "State",
    "ThreadWaiter",
    "new_thread_waiter",
    "signal_of",
    "wake",
]


T_co = TypeVar("T_co", covariant=True)


class Result(NamedTuple, Generic[T_co]):
    """What a call returns: the flight's ``value``, whether this caller ``joined``
    (False for the leader), and the flight's fencing ``token``.

    Immutable. A tuple underneath (ADR 0003): it is made on every call, and a tuple
    is the cheapest immutable record Python has; ``value, joined, token = result``
    works too.
    """

    value: T_co
    joined: bool
    token: int


class State(Enum):
    """The states of a flight; see the module docstring for the edges."""

    # Members are singletons: hashed by identity in C, not by Enum's Python-level hash
    # of the name (each state change checks its edge in a set of pairs).
    __hash__ = object.__hash__

    IDLE = "idle"
    RUNNING = "running"
    RETRY_PENDING = "retry-pending"
    SETTLING = "settling"
    DONE = "done"


IDLE: Final = State.IDLE
RUNNING: Final = State.RUNNING
RETRY_PENDING: Final = State.RETRY_PENDING
SETTLING: Final = State.SETTLING
DONE: Final = State.DONE

_EDGES: Final = frozenset(
    {
        (IDLE, RUNNING),
        (IDLE, DONE),
        (RUNNING, RETRY_PENDING),
        (RETRY_PENDING, RUNNING),
        (RETRY_PENDING, DONE),
        (RUNNING, SETTLING),
        (RUNNING, DONE),
        (SETTLING, DONE),
    }
)


class Outcome(Enum):
    """How a flight ended."""

    VALUE = "value"  # the work returned; ``value`` (or ``data`` with a codec)
    ERROR = "error"  # the work (or encode) raised an Exception: ``error``
    TIMEOUT = "timeout"  # its last attempt ran past the deadline: ``error``
    INTERRUPTED = "interrupted"  # a BaseException stopped it: ``error`` for the leader
    LOST = "lost"  # (wide scopes) the leader lost its lease: ``error`` is its LeaseLostError
    ABANDONED = "abandoned"  # an IDLE flight nobody claimed; no caller waits on it


class Signal(Enum):
    """What a waiter is woken with (a ``Flight`` instead means: claim that flight)."""

    SETTLED = "settled"  # read the flight's outcome
    CLOSED = "closed"  # the group closed
    EXPIRED = "expired"  # this caller's own timeout passed (set by its timer)
    JOINED = "joined"  # (wide scopes) the leading caller's flight joined one led elsewhere


SETTLED: Final = Signal.SETTLED
CLOSED: Final = Signal.CLOSED
EXPIRED: Final = Signal.EXPIRED
JOINED: Final = Signal.JOINED


class Role(Enum):
    """What ``FlightTable.arrive`` / ``claim`` made of a caller."""

    LEAD = "lead"  # the caller leads: it must start the work now
    LEADING = "leading"  # the caller leads and has started the work
    JOIN = "join"  # registered as a joiner of the flight
    WAIT_END = "wait-end"  # fresh: registered to wait for the flight's end
    TAKE = "take"  # the flight is already done and its outcome is the caller's
    KEPT = "kept"  # served a kept outcome (retention): no flight, no on_join


ThreadWaiter = LockType
"""A waiting thread is a bare lock, acquired once when made; the waker releases it.
Its signal is read from the flight it waits on (``signal_of``), so it needs no object
of its own."""


def new_thread_waiter() -> LockType:
    """A pre-acquired lock for a thread to block on."""
    lock = allocate_lock()
    lock.acquire()
    return lock


Waiter = asyncio.Future[Any] | LockType


class Attempt:
    """One attempt of a flight's work: its fencing token and its lease.

    A flight has one attempt, or several under a Retry policy; each gets a new
    token. The context variable of a running work holds its attempt, so a work
    left running past its deadline still sees its own (lost) lease.
    """

    __slots__ = ("flight", "lease", "lost", "revoked", "timed_out", "timer", "token")

    def __init__(self, flight: Flight, token: int) -> None:
        self.flight = flight
        self.token = token
        self.lease: Lease | None = None
        self.lost = False
        self.revoked = False  # (wide scopes) lost to the scope, not to a deadline or close
        self.timed_out = False
        self.timer: asyncio.TimerHandle | None = None  # an async attempt's deadline

    def get_lease(self) -> Lease:
        """The lease of this attempt (made on first use)."""
        lease = self.lease
        if lease is None:
            lease = self.lease = Lease._new(self.flight.key, self.token, self.lost)
            if self.lost:  # lose() may have run between the read and the store
                lease._lose()
        return lease

    def lose(self) -> None:
        """Mark the lease lost: this attempt's outcome will not be delivered."""
        self.lost = True
        if self.lease is not None:
            self.lease._lose()

    def lose_in_child(self) -> None:
        """(Wide scopes, in a forked child) the scope's lease is the parent's: lost to
        the scope here. Its ``wait_lost`` callers were the parent's, and are not woken."""
        self.lost = self.revoked = True
        if self.lease is not None:
            self.lease._lose_in_child()


class Flight:
    """One run of the work for one key, from its start to its outcome.

    Fields written under the table lock only: ``state``, ``waiters``, ``fresh``,
    ``claims``, ``joiners``, ``next``. Outcome fields (``outcome``, ``value``,
    ``error``, ``data``) are written once, under the lock, before ``state``
    becomes DONE, and read by callers only after they were signalled (or saw
    DONE under the lock). ``parent``, ``task`` and ``loop`` are written by the
    leader when it starts the work, before anyone can read them.

    No ``__slots__``: the class-level defaults below make a new flight cost four
    assignments on the miss path; most flights never touch the other fields.
    """

    # waiter -> None, in wake order: the joiners, and the leader when it waits.
    # A shared empty dict until the first waiter comes (copy on first write).
    waiters: dict[Waiter, None] = {}  # noqa: RUF012 - replaced, never mutated
    fresh: list[Waiter] | None = None  # fresh callers waiting for the end
    # (wide scopes) fresh callers that came before the scope let the work start here:
    # woken with JOINED to join this flight instead of waiting for its end (ran_here)
    promoted: frozenset[Waiter] = frozenset()
    # (wide scopes) the scope answered: the work runs here, or the flight joined one led
    # elsewhere. Until then a joiner's on_join waits (``defer_on_join``): the answer may
    # be a kept outcome, and a call served from one never calls on_join.
    decided = False
    led_here = False  # (wide scopes) the scope let its work run here (ran_here)
    # (wide scopes) the scope could not serve it (unreachable, another version): it
    # counts as no flight, no join and no interruption (docs/observability.md)
    unserved = False
    deferred: list[Waiter] | None = None  # joiners whose on_join waits for the answer
    claims = 0  # pending claims on an IDLE flight (I4)
    joiners = 0
    next: Flight | None = None  # the flight after this one, for its fresh callers
    outcome: Outcome | None = None
    value: Any = None
    error: BaseException | None = None
    data: bytes | None = None  # the encoded value, with a codec
    failure: tuple[str, str, str, str] | None = None  # made once for all joiners
    parent: Flight | None = None  # the flight whose work made this call (I6)
    attempt: Attempt | None = None  # the running (or last) attempt
    policy: FlightPolicy = NO_POLICY  # the leader's, for the flight's whole life
    leader_waiter: Waiter | None = None
    closed = False  # its waiters were woken by the group's close()
    loop: asyncio.AbstractEventLoop | None = None  # where an async work runs
    task: asyncio.Task[None] | None = None  # the work's own task: the group owns it
    started = 0  # perf_counter_ns() when the work started
    # While stats time waits: how many joiners were timed, and their arrival times' sum.
    timed = 0
    joined_ns = 0
    # The wide scopes: ``wide`` is the scope's call while this process leads there;
    # ``remote``: the outcome came from elsewhere (every caller here is a joiner and
    # raises a copy of ``error``); ``joined_remote``: told it joined a flight led
    # elsewhere (the leading caller's on_join is due).
    wide: Any = None
    # (wide scopes) ends of sync attempts left running past their deadline: the key
    # lock is held until each is set
    stragglers: list[threading.Event] | None = None
    fresh_lead = False  # its leader came with fresh=True (the wide scope must know)
    # (wide scopes) the token of the flight whose end its fresh callers waited for: a
    # flight of the scope that began after that one began after their calls
    after: int | None = None
    # (wide scopes) ``token`` may be the ``after`` of its next flight: this process led
    # the flight under the scope's token, and every fresh caller waiting for its end came
    # before its landing was handed to the scope (SETTLING), so before the scope could
    # end it and begin another. Not so for a flight led elsewhere (its end reaches this
    # process after the scope may have begun the next one), a local token (a retry's
    # before the scope bound it), or an end the scope did not see (unreachable, lease
    # lost): its next flight then names no flight, and no flight that exists when it
    # asks will do (ADR 0005).
    scoped = False
    remote = False
    joined_remote = False
    # (wide scopes) it left the table (a forget) and, when it ended, its fresh callers
    # went on waiting for the end of the key's flight then (``next``): that one may have
    # joined a flight of the scope that began before their calls
    moved = False
    # copied into a forked child, where it left its table: counted out of ``in_flight``
    # there, so its settle (a work the child runs on) is not counted again
    forked = False

    def __init__(self, tkey: Hashable, key: str, token: int, state: State) -> None:
        self.tkey = tkey
        self.key = key
        self.token = token
        self.state = state

    def _move(self, old: State, new: State) -> None:
        assert self.state is old, (self.state, old, new)
        assert (old, new) in _EDGES, (old, new)
        self.state = new

    def lose(self) -> None:
        """Mark the running attempt's lease lost (the group closed)."""
        if self.attempt is not None:
            self.attempt.lose()

    def in_chain_of(self, current: Flight | None) -> bool:
        """True if ``current`` (the flight whose work is making a call) is this
        flight or was started, through nested calls, by this flight's work."""
        while current is not None:
            if current is self:
                return True
            current = current.parent
        return False

    def __repr__(self) -> str:
        return f"<Flight key={self.key!r} token={self.token} {self.state.value}>"


def _stragglers_done(flight: Flight) -> bool:
    """Every sync attempt of ``flight`` left running past its deadline has returned."""
    return all(ended.is_set() for ended in flight.stragglers or ())


def _blocks_its_loop(key: str) -> RuntimeError:
    return RuntimeError(
        f"run_sync({key!r}) was called on the thread of the event loop that runs "
        "this flight's work, so it would block that work forever; use await run()."
    )


def _calls_itself(key: str) -> RuntimeError:
    return RuntimeError(
        f"A work of the flight of {key!r} called the same key on the same group; "
        "it would wait for itself. Give the inner call a key of its own."
    )


def waited_on(flight: Flight, waiter: Waiter) -> Flight:
    """The flight a fresh caller of ``flight`` (its ``waiter``) waits on: ``flight``,
    or along the links of flights whose fresh callers moved on (``Flight.moved``), the
    one that promoted it to a joiner, else the last one."""
    while waiter not in flight.promoted and flight.moved and flight.next is not None:
        flight = flight.next
    return flight


def signal_of(flight: Flight, fresh_of: Flight | None, waiter: Waiter) -> Signal | Flight:
    """The signal ``waiter`` of ``flight`` was handed, read from the flight itself
    (valid once the waiter was detached, I3). ``fresh_of`` is the flight whose end
    a fresh caller waited for, else None."""
    if fresh_of is not None:
        fresh_of = waited_on(fresh_of, waiter)
        if waiter in fresh_of.promoted:
            return JOINED
        following = fresh_of.next
        return following if following is not None else CLOSED
    if flight.promoted and waiter in flight.promoted:  # a joiner whose on_join waited
        return JOINED
    return CLOSED if flight.closed else SETTLED


def _kept_flight(payload: Flight | Result[Any]) -> Flight:
    """A settled flight standing for a kept payload (arrive's KEPT role)."""
    if isinstance(payload, Flight):
        return payload
    flight = Flight(None, "", payload.token, DONE)
    flight.outcome = Outcome.VALUE
    flight.value = payload.value
    vars(flight)["joined_result"] = payload
    return flight


def _add_waiter(flight: Flight, waiter: Waiter) -> None:
    waiters = flight.waiters
    if not waiters and waiters is Flight.waiters:
        flight.waiters = {waiter: None}
    else:
        waiters[waiter] = None


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(EXPIRED)


def _wake_futures(futures: list[asyncio.Future[Any]], signal: Signal | Flight) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(signal)


def wake(waiters: Iterable[Waiter], signal: Signal | Flight) -> None:
    """Hand ``signal`` to each waiter (I3). Call without the table lock (I5).

    A future whose loop runs in this thread is resolved at once; the futures of
    each other loop are resolved by one ``call_soon_threadsafe`` on that loop.
    """
    running = events._get_running_loop()
    batches: dict[asyncio.AbstractEventLoop, list[asyncio.Future[Any]]] | None = None
    for waiter in waiters:
        if type(waiter) is LockType:
            waiter.release()  # the thread reads its signal from the flight
            continue
        # (type() is does not narrow on every Python mypy checks for; no cast on this path)
        fut: asyncio.Future[Any] = waiter  # type: ignore[assignment, unused-ignore]
        loop = fut.get_loop()
        if loop is running:
            if not fut.done():
                fut.set_result(signal)
        else:
            if batches is None:
                batches = {}
            batch = batches.get(loop)
            if batch is None:
                batches[loop] = [fut]
            else:
                batch.append(fut)
    if batches:
        for loop, futures in batches.items():
            # A closed loop raises RuntimeError: its tasks are gone, nobody waits there.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake_futures, futures, signal)


# (wide scopes) the tables of this process by scope: groups of one scope are one group,
# and a sync call must see the flights of the others (FlightTable._kin_blocks)
_KIN_LOCK = threading.Lock()
# The size of an outcome that could not be measured for Retention: it is not kept.
UNMEASURED: Final = -1

_KIN: dict[Hashable, weakref.WeakSet[FlightTable]] = {}
_KIN_PRUNE_AT = 64  # scopes registered before the next sweep of those left empty


# Every table of this process, for a forked child (``_after_fork``).
_TABLES: weakref.WeakSet[FlightTable] = weakref.WeakSet()


def _after_fork() -> None:
    """(In a forked child) a lock another thread of the parent held at the fork stays
    held here for ever, and the flights copied from the parent's tables have no leader
    here (their threads and loops were not copied): a call that joined one would wait
    for ever. So every table gets a new lock and drops its flights (ADR 0030)."""
    global _KIN_LOCK
    _KIN_LOCK = threading.Lock()
    for table in list(_TABLES):
        table._forked()


os.register_at_fork(after_in_child=_after_fork)


def _kin_register(scope: Hashable, table: FlightTable) -> None:
    global _KIN_PRUNE_AT
    with _KIN_LOCK:
        if len(_KIN) >= _KIN_PRUNE_AT:
            # Scopes whose groups were all collected (a group per temporary directory),
            # swept when the register doubled: amortised, not a scan per group made.
            for gone in [name for name, tables in _KIN.items() if not tables]:
                del _KIN[gone]
            _KIN_PRUNE_AT = max(64, 2 * len(_KIN))
        _KIN.setdefault(scope, weakref.WeakSet()).add(table)


class FlightTable:
    """The in-process flight table of one group: key -> Flight, thread-safe.

    Every method runs under ``lock``, touches no user code, and returns what the
    caller must do after releasing it (decide under the lock, act after).
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_evict_log_at",
        "_lead_counts",
        "_next_token",
        "causes",
        "closed",
        "detached",
        "flights",
        "forgetting",
        "kept",
        "left_holds",
        "lingering",
        "lock",
        "scope",
        "stats",
        "wide",
    )

    def __init__(
        self, wide: bool = False, scope: Hashable | None = None, left_holds: bool = False
    ) -> None:
        # A wide scope keeps outcomes where every process reaches them, not here.
        self.wide = wide
        # (wide scopes) a flight that left the table holds its key in the scope while its
        # work runs (a key lock: Scope.left_flights_hold_keys)
        self.left_holds = left_holds
        # (wide scopes) what names the scope (its directory, its Redis and namespace):
        # another group of this process with the same scope is the same group (I6)
        self.scope = scope
        if scope is not None:
            _kin_register(scope, self)
        _TABLES.add(self)
        # A wide group counts a flight when the scope says its work runs here (ran_here),
        # never before: a flight joined elsewhere must not count as one, then stop counting
        # (counters only grow).
        self._lead_counts = 0 if wide else 1
        self.lock = threading.Lock()
        self.flights: dict[Hashable, Flight] = {}
        # flights that left the table by forget() but still run
        self.detached: set[Flight] = set()
        # (wide scopes) settled flights whose sync work runs on past its deadline (and
        # holds the key lock, in the directory scope), until it returns
        self.lingering: set[Flight] = set()
        # (wide scopes) keys whose forget() the scope has not confirmed yet, with how many
        # such forget() calls run: the scope may still make a call join their left flight
        self.forgetting: dict[Hashable, int] = {}
        # kept outcomes (Retention): settled flights, made on the first one kept
        self.kept: RetentionStore | None = None
        # (wide scopes) the errors of failures this table's group landed, for the
        # ``__cause__`` of their FlightFailedError in every group of this process that
        # gets them from the scope (wide.KeptCauses): made at the first one
        self.causes: KeptCauses | None = None
        self._clock: Callable[[], float] = time.monotonic
        self.stats = Recorder()
        self.closed = False
        self._next_token = 0
        self._evict_log_at = 0.0

    def _forked(self) -> None:
        """(In a forked child, the only thread) see ``_after_fork``. Kept outcomes stay:
        they are values. A wide flight's work that this child runs on (it forked inside
        the work) holds no lease of the scope here: its lease is lost, so its outcome
        is never taken for the flight's (its call raises LeaseLostError)."""
        self.lock = threading.Lock()
        copied = [*self.flights.values(), *self.detached, *self.lingering]
        self.flights = {}
        self.detached = set()
        self.lingering = set()
        self.forgetting = {}
        for flight in copied:
            if flight.state is not IDLE and flight.state is not DONE:  # in ``in_flight``
                flight.forked = True
                self.stats.in_flight -= 1
        if self.wide:
            for flight in copied:
                if flight.attempt is not None:
                    flight.attempt.lose_in_child()

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Drive retention with ``clock`` (tests use a fake one)."""
        with self.lock:
            self._clock = clock
            if self.kept is not None:
                self.kept._clock = clock

    # -- arriving -----------------------------------------------------------

    def arrive(
        self,
        tkey: Hashable,
        key: str,
        *,
        fresh: bool,
        make_waiter: Callable[[], Waiter],
        chain: Flight | None,
        blocking_loop: asyncio.AbstractEventLoop | None,
        policy: FlightPolicy = NO_POLICY,
    ) -> tuple[Role, Flight, Waiter | None]:
        """Decide lead, join, wait-for-end or kept for a new call of ``tkey``.

        ``chain`` is the flight whose work makes the call, if any (I6);
        ``blocking_loop`` is the event loop that this call would block while it
        waits (a sync call made on a loop's thread), or None; ``policy`` is the
        caller's, which a flight it leads keeps.
        """
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            stats = self.stats
            flight = self.flights.get(tkey)
            if (
                chain is not None
                and self.wide
                and (
                    ((self.detached or self.lingering) and self._left_in(tkey, chain))
                    or self._runs_in_kin(tkey, chain)
                )
            ):
                # I6 for a flight of this scope that the check below cannot see: one
                # that left this table while its work runs (a forget(), here or in
                # another process, detached it (ADR 0026), or it settled past its
                # deadline), or one that another group of this process with the same
                # scope runs. A new lead would wait for the key lock that very flight
                # holds (directory scope) or run the key again inside its own work
                # (fleet); a join would wait for itself.
                raise _calls_itself(key)
            if blocking_loop is not None and self.scope is not None and self._scope_blocks(
                tkey, blocking_loop
            ):
                # run_sync on the thread of the loop that runs the work of another flight
                # of the key in this scope (another group's, or one that left its table
                # while its work runs: forgotten, lingering, its group closed): the scope
                # would make it join that flight, or wait for the key lock its work holds,
                # and block the work it waits for.
                raise _blocks_its_loop(key)
            if flight is None:
                if self.kept is not None and not fresh:
                    entry = self.kept.get(tkey)
                    if entry is not None:
                        stats.calls += 1
                        stats.joins += 1
                        return Role.KEPT, _kept_flight(entry.payload), None
                if policy is not NO_POLICY:
                    self._check_flights(key, policy)
                stats.calls += 1
                stats.flights += self._lead_counts
                stats.in_flight += 1
                self._next_token += 1
                token = self._next_token
                flight = Flight(tkey, key, token, RUNNING)
                if fresh:
                    flight.fresh_lead = True
                flight.attempt = Attempt(flight, token)
                flight.started = time.perf_counter_ns()
                if policy is not NO_POLICY:
                    flight.policy = policy
                self.flights[tkey] = flight
                return Role.LEAD, flight, None
            state = flight.state
            if state is IDLE:  # a flight that waits for its first leader
                stats.calls += 1
                self._lead(flight, policy)
                return Role.LEAD, flight, None
            if chain is not None and flight.in_chain_of(chain):  # I6
                raise _calls_itself(key)
            if blocking_loop is not None and flight.loop is blocking_loop:
                raise _blocks_its_loop(key)
            self._check_waiters(flight)
            stats.calls += 1
            waiter = make_waiter()
            if fresh:  # an IDLE flight was led above: this one is running
                if state is SETTLING:  # its scope may have ended it and begun the next
                    flight.scoped = False
                if flight.fresh is None:
                    flight.fresh = [waiter]
                else:
                    flight.fresh.append(waiter)
                return Role.WAIT_END, flight, waiter
            _add_waiter(flight, waiter)
            flight.joiners += 1
            stats.joins += 1
            if stats.timing:
                flight.timed += 1
                flight.joined_ns += time.perf_counter_ns()
            return Role.JOIN, flight, waiter

    def take_kept(self, tkey: Hashable) -> Flight | Result[Any] | None:
        """The kept outcome of ``tkey`` if there is one and no flight of the key runs:
        the Result to return, or the settled flight to deliver from. The hot path of
        Retention, before ``arrive``."""
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            kept = self.kept
            if kept is None or tkey in self.flights:
                return None
            entry = kept.get(tkey)
            if entry is None:
                return None
            stats = self.stats
            stats.calls += 1
            stats.joins += 1
            return entry.payload  # type: ignore[no-any-return]

    def _check_flights(self, key: str, policy: FlightPolicy) -> None:
        limits = policy.limits
        if (
            limits is not None
            and limits.max_flights is not None
            and len(self.flights) + len(self.detached) >= limits.max_flights
        ):
            raise TooManyFlightsError(key, limits.max_flights)

    def _check_waiters(self, flight: Flight) -> None:
        """Refuse a caller that would wait on ``flight`` past its ``max_waiters``: its
        joiners, its fresh callers (they wait for its end) and the pending claims of the
        fresh callers of the flight before it (they join it once they wake, and are
        never refused then) count, its leader not."""
        limits = flight.policy.limits
        if limits is not None and limits.max_waiters is not None:
            waiting = len(flight.waiters) + len(flight.fresh or ()) + flight.claims
            if flight.leader_waiter is not None and flight.leader_waiter in flight.waiters:
                waiting -= 1
            if waiting >= limits.max_waiters:
                raise TooManyWaitersError(flight.key, limits.max_waiters)

    def claim(
        self,
        flight: Flight,
        make_waiter: Callable[[], Waiter],
        policy: FlightPolicy,
        claimed: bool = True,
        counted: bool = False,
    ) -> tuple[Role, Waiter | None]:
        """A fresh caller takes its claim on ``flight`` (the flight after the one
        it waited for): lead it if nobody does, else join it, or take its
        outcome if it already ended (it started after the caller's call).
        ``claimed=False``: a caller promoted by ``ran_here`` joins the flight it
        waited on (it holds no claim: that flight was never IDLE). ``counted``: a
        joiner whose on_join waited for the scope's answer, already counted as one."""
        with self.lock:
            if claimed:
                flight.claims -= 1
            if self.closed:
                raise GroupClosedError()
            if flight.state is IDLE:
                self._lead(flight, policy)
                return Role.LEAD, None
            if flight.state is DONE:
                # I4: a flight with a pending claim is never abandoned.
                assert flight.outcome is not Outcome.ABANDONED
                if not counted:
                    self.stats.joins += 1
                return Role.TAKE, None
            waiter = make_waiter()
            _add_waiter(flight, waiter)
            if counted:
                return Role.JOIN, waiter
            flight.joiners += 1
            self.stats.joins += 1
            if self.stats.timing:
                flight.timed += 1
                flight.joined_ns += time.perf_counter_ns()
            return Role.JOIN, waiter

    def _lead(self, flight: Flight, policy: FlightPolicy) -> None:
        flight._move(IDLE, RUNNING)
        flight.fresh_lead = True  # an IDLE flight is led by a fresh caller
        self._next_token += 1
        flight.token = self._next_token
        flight.attempt = Attempt(flight, flight.token)
        flight.policy = policy
        stats = self.stats
        stats.flights += self._lead_counts
        stats.in_flight += 1
        flight.started = time.perf_counter_ns()

    def release_claim(self, flight: Flight) -> None:
        """A caller told to claim ``flight`` withdrew instead (I4)."""
        with self.lock:
            flight.claims -= 1
            if flight.state is IDLE and flight.claims == 0:
                flight._move(IDLE, DONE)
                flight.outcome = Outcome.ABANDONED
                if self.flights.get(flight.tkey) is flight:  # I1
                    del self.flights[flight.tkey]
                self.detached.discard(flight)

    def wait_as_leader(self, flight: Flight, waiter: Waiter) -> bool:
        """Register the leader's own waiter; False if the flight already ended.

        Raises GroupClosedError if the group closed after the leader started.
        """
        with self.lock:
            if flight.state is DONE:
                return False
            if self.closed:
                raise GroupClosedError()
            _add_waiter(flight, waiter)
            flight.leader_waiter = waiter
            return True

    def ran_here(self, flight: Flight) -> list[Waiter] | None:
        """(Wide scopes) the scope let ``flight``'s work run here: count the flight.

        Its fresh callers came while it waited for the scope's answer, so before its
        work starts: they join it (ADR 0005: the next flight to start is this one)
        instead of waiting for its end and leading one more. Returns them, detached,
        to wake with JOINED; each then joins through ``claim(claimed=False)``. So are
        the joiners whose on_join waited for the answer (``defer_on_join``).

        Raises GroupClosedError once the group closed: no work starts after close().
        """
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            self.stats.flights += 1
            flight.scoped = True
            flight.led_here = True
            deferred = self._decided(flight)
            fresh = flight.fresh
            if not fresh or flight.state is not RUNNING:
                return deferred
            flight.fresh = None
            if deferred:
                flight.promoted = flight.promoted.union(fresh)
                return [*deferred, *fresh]
            flight.promoted = frozenset(fresh)
            return fresh

    def defer_on_join(self, flight: Flight, waiter: Waiter) -> bool | None:
        """(A joiner with an on_join) whether its on_join runs now: True, the flight
        is decided (the process scope's always is); None, it waits for the scope's
        answer (its waiter is woken with JOINED then, or SETTLED by a kept outcome);
        False, the flight ended before the scope let it run or join anywhere (a kept
        outcome, or the scope's failure to serve it): no on_join."""
        with self.lock:
            if not self.wide or flight.decided:
                return True
            if flight.state is DONE or waiter not in flight.waiters:
                return False  # woken already (settled or closed) while undecided
            if flight.deferred is None:
                flight.deferred = [waiter]
            else:
                flight.deferred.append(waiter)
            return None

    def _decided(self, flight: Flight) -> list[Waiter] | None:
        """Mark ``flight`` decided; detach the joiners whose on_join waited for it
        (under the lock), to wake with JOINED."""
        flight.decided = True
        deferred = flight.deferred
        if deferred is None:
            return None
        flight.deferred = None
        waiters = flight.waiters
        woken = [w for w in deferred if waiters.pop(w, False) is None]
        if woken:
            flight.promoted = flight.promoted.union(woken)
        return woken or None

    def handing(self, flight: Flight) -> None:
        """(Wide scopes) the landing of ``flight`` goes to the scope now (SETTLING): a
        fresh caller that comes from here on may come after the scope began the next
        flight. (A retry given up as the group closed lands from RETRY_PENDING.)"""
        with self.lock:
            if flight.state is RUNNING:
                flight._move(RUNNING, SETTLING)

    def ran_elsewhere(self, flight: Flight, joined: bool, unserved: bool = False) -> None:
        """(Wide scopes) ``flight`` ended without its work running here: its leading
        caller counts as a join if it had a flight's outcome from elsewhere (``joined``),
        unless it was counted when the flight joined; a call the scope could not serve
        (``unserved``: unreachable, closed) is no join, and counts nothing at its end
        unless the scope had answered it first."""
        with self.lock:
            flight.scoped = False  # it ended elsewhere, maybe before it ended here
            if joined and not flight.joined_remote:
                self.stats.joins += 1
            elif unserved and not flight.decided:
                flight.unserved = True

    def joined_remote(self, flight: Flight) -> list[Waiter] | None:
        """(Wide scopes) ``flight`` joined a flight led elsewhere: mark it, and detach
        the leading caller's waiter if it waits, and the joiners whose on_join waited
        for the answer, to wake them with JOINED."""
        with self.lock:
            if not flight.joined_remote:  # a rejoin after a failover is the same join
                flight.joined_remote = True
                self.stats.joins += 1
            woken = self._decided(flight)
            waiter = flight.leader_waiter
            if waiter is not None and flight.waiters.pop(waiter, False) is None:
                flight.leader_waiter = None
                if woken is None:
                    return [waiter]
                woken.append(waiter)
            return woken

    def withdraw(self, flight: Flight, waiter: Waiter) -> bool:
        """Remove a caller's waiter (timeout, cancel, on_join raised).

        True if it was removed: no signal will come (I3). False if a signal was
        already handed to it or is on its way.
        """
        with self.lock:
            if flight.waiters and flight.waiters.pop(waiter, False) is None:
                return True
            while True:
                fresh = flight.fresh
                if fresh is not None and waiter in fresh:
                    fresh.remove(waiter)
                    return True
                following = flight.next
                if not flight.moved or following is None:
                    return False
                flight = following  # its fresh callers wait there now

    # -- running and settling -------------------------------------------------

    def retry_pending(self, flight: Flight) -> bool:
        """The attempt failed and another follows after a pause; False if the group
        closed (nobody waits any more: the flight ends with this failure)."""
        with self.lock:
            if self.closed:
                return False
            flight._move(RUNNING, RETRY_PENDING)
            return True

    def next_attempt(self, flight: Flight) -> Attempt | None:
        """Start the next attempt with a new token; None if the group closed."""
        with self.lock:
            if self.closed:
                return None
            flight._move(RETRY_PENDING, RUNNING)
            self._next_token += 1
            flight.token = self._next_token
            flight.scoped = False  # (wide) the scope's token comes later, unseen here
            attempt = flight.attempt = Attempt(flight, flight.token)
            self.stats.flights += 1
            return attempt

    def settle(
        self,
        flight: Flight,
        outcome: Outcome,
        value: Any,
        error: BaseException | None,
        data: bytes | None,
        size: int = 0,
    ) -> tuple[dict[Waiter, None], list[Waiter] | None] | None:
        """Record the outcome (I2) and detach the waiters to wake (I3). ``size`` is
        the outcome's size for Retention, measured by the caller outside the lock.

        Returns (waiters to wake with SETTLED, fresh waiters to wake with a claim
        on ``flight.next``), or None if the flight had already settled.
        """
        ended = time.perf_counter_ns()
        with self.lock:
            if flight.state is DONE:  # I2
                return None
            flight.outcome = outcome
            if value is not None:  # the class defaults are None: write only what is set
                flight.value = value
            if error is not None:
                flight.error = error
            if data is not None:
                flight.data = data
            flight.state = DONE  # from RUNNING, RETRY_PENDING or SETTLING
            flight.attempt = None  # the attempt points at its flight: no cycle to collect
            if flight.stragglers is not None and not _stragglers_done(flight):
                self.lingering.add(flight)  # until unlinger: its last work returned
            waiters = flight.waiters
            if waiters:
                flight.waiters = {}
            fresh = flight.fresh
            if fresh is not None:
                flight.fresh = None
            tkey = flight.tkey
            flights = self.flights
            if flights.get(tkey) is flight:  # I1
                del flights[tkey]
                if flight.policy.keeps and not self.closed and not self.wide:
                    self._keep(flight, size)
                elif self.kept is not None:
                    # A newer outcome that is not kept: the key's older kept one (a
                    # fresh call led past it) must not be served after it.
                    self.kept.discard(tkey)
            elif self.detached:
                self.detached.discard(flight)  # a forgotten flight is never kept
            stats = self.stats
            if flight.forked:
                pass  # counted out of in_flight at the fork (FlightTable._forked)
            elif flight.unserved:
                stats.in_flight -= 1  # no flight, no join: nothing else to count
            else:
                if flight.closed and (flight.led_here or not self.wide):
                    # Its group closed while it ran: its callers got GroupClosedError and
                    # its lease was lost, whatever the work did after, and whichever came
                    # first (the work's end, or the scope's loss of its lease).
                    failed, interrupted, lost = False, True, True
                else:
                    failed = outcome is Outcome.ERROR or outcome is Outcome.TIMEOUT
                    lost = outcome is Outcome.LOST
                    interrupted = lost or outcome is Outcome.INTERRUPTED
                stats.settled(
                    failed, interrupted, lost, flight.joiners, (ended - flight.started) // 1000
                )
            timed = flight.timed
            if timed:
                # Each joiner's wait is its flight's mean joiner wait: the sum and the
                # count are exact, the spread within one flight is not kept.
                mean = (timed * ended - flight.joined_ns) // (timed * 1000)
                stats.wait_us.record(mean, timed)
            if fresh and not self.closed:
                following = flights.get(tkey)
                if self.wide and following is not None and following.state is not IDLE:
                    # This flight left the table (a forget, here or elsewhere) and a newer
                    # local flight took the key. It may have joined a flight of the scope
                    # that began before these callers came (a forget made elsewhere is
                    # heard here late): they wait for its end, as fresh callers that came
                    # now would, and take the flight after it.
                    if following.state is SETTLING:
                        following.scoped = False
                    following.fresh = [*(following.fresh or ()), *fresh]
                    flight.next = following
                    flight.moved = True
                    return waiters, None
                if following is None:
                    # Its token comes when it is led (_lead): a flight that starts later
                    # must carry the larger token, even if it was made earlier.
                    following = Flight(tkey, flight.key, 0, IDLE)
                    if flight.scoped and outcome is not Outcome.LOST:
                        following.after = flight.token
                    flights[tkey] = following
                following.claims += len(fresh)
                flight.next = following
            return waiters, fresh

    def _keep(self, flight: Flight, size: int) -> None:
        """Keep a settled flight's outcome for later calls (Retention)."""
        retention = flight.policy.retention
        assert retention is not None
        ok = flight.outcome is Outcome.VALUE
        ttl = retention.success if ok else retention.error
        # A timeout or an interruption teaches nothing worth keeping; either way the
        # key's older kept outcome (a fresh call led past it) is no longer its latest.
        if not ttl or (not ok and flight.outcome is not Outcome.ERROR) or size == UNMEASURED:
            if self.kept is not None:
                self.kept.discard(flight.tkey)
            return
        if self.kept is None:
            self.kept = RetentionStore(retention.max_items, retention.max_bytes, self._clock)
        flight.parent = None  # a kept flight holds its outcome, nothing else
        flight.task = None
        flight.loop = None
        # A kept value (without a codec) is kept as the one Result every call it serves
        # returns (ADR 0003); a failure, or encoded data, as the settled flight itself.
        payload: Flight | Result[Any] = flight
        if ok and flight.data is None:
            payload = Result(flight.value, True, flight.token)
        kept = self.kept
        evicted = kept.evicted
        # The flight's own bounds (an operation's Retention may differ from the group's).
        kept.put(
            flight.tkey, ok, payload, flight.token, ttl, size,
            (retention.max_items, retention.max_bytes),
        )
        if kept.evicted != evicted:
            self._evicted(kept, retention)

    def _evicted(self, kept: RetentionStore, retention: Retention) -> None:
        """Say (at most once a minute) that the bounds evict kept outcomes: a bound
        that is too small turns retention into a miss."""
        now = time.monotonic()
        if now < self._evict_log_at:
            return
        self._evict_log_at = now + 60.0
        log.info(
            "retention evicted %d kept outcomes so far (max_items=%d, max_bytes=%s); "
            "raise the bounds if later calls should find them", kept.evicted,
            retention.max_items, retention.max_bytes,
        )

    # -- the group ------------------------------------------------------------

    def forget(self, tkey: Hashable, asking: bool = False) -> None:
        """Detach the flight of ``tkey`` (it runs on for its callers); the next
        call leads a new flight. ``asking``: the scope is asked to forget it too, and
        ``forget_answered`` follows."""
        with self.lock:
            if asking:
                self.forgetting[tkey] = self.forgetting.get(tkey, 0) + 1
            if self.kept is not None:
                self.kept.discard(tkey)
            flight = self.flights.get(tkey)
            if flight is not None:
                # It runs on (or, if IDLE, its claimants still lead it) for the
                # callers it has; close() must still find it. Detached before it leaves:
                # another group's table reads both without this lock (``holds``).
                self.detached.add(flight)
                del self.flights[tkey]

    def forget_answered(self, tkey: Hashable) -> None:
        """The scope answered (or failed) one ``forget(tkey, asking=True)``."""
        with self.lock:
            left = self.forgetting.get(tkey, 0) - 1
            if left > 0:
                self.forgetting[tkey] = left
            else:
                self.forgetting.pop(tkey, None)

    def _left_in(self, tkey: Hashable, current: Flight | None) -> bool:
        """(Under the lock) True if ``current``, or a flight whose work started it, is
        a flight of this table with the key ``tkey`` that left it while its work runs:
        detached, or lingering (see ``lingering``)."""
        while current is not None:
            if current.tkey == tkey and (current in self.detached or current in self.lingering):
                return True
            current = current.parent
        return False

    def has_kin(self) -> bool:
        """Another group of this process has this table's scope (wide scopes)."""
        return bool(self._kin())

    def cause_of(self, key: str, token: int) -> BaseException | None:
        """The error of the failure that flight ``token`` of ``key`` landed, if a group
        of this process with this scope led it and still remembers it."""
        for table in (self, *self._kin()):
            causes = table.causes
            if causes is not None and (error := causes.cause(key, token)) is not None:
                return error
        return None

    def _kin(self) -> list[FlightTable]:
        """The other tables of this scope in this process (wide scopes)."""
        with _KIN_LOCK:
            tables = list(_KIN.get(self.scope, ()))
        return [table for table in tables if table is not self]

    def _runs_in_kin(self, tkey: Hashable, current: Flight | None) -> bool:
        """True if ``current``, or a flight whose work started it, is a flight of the
        key ``tkey`` that another group of this process with the same scope runs: the
        scope would make this call join it (or wait for its key lock), so its work
        would wait for itself. A flight whose work is over (a task it started may
        outlive it) does not count."""
        if self.scope is None:
            return False
        tables: list[FlightTable] | None = None
        while current is not None:
            if current.tkey == tkey:
                if tables is None:
                    tables = self._kin()
                if any(table.holds(current) for table in tables):
                    return True
            current = current.parent
        return False

    def _scope_blocks(self, tkey: Hashable, loop: asyncio.AbstractEventLoop) -> bool:
        """(Under the lock) True if a flight of ``tkey`` whose async work runs on
        ``loop`` here (not known to be led elsewhere) is another table's of this scope
        in this process, or (directory scope) left its table while its work runs (this
        table's check of its own flight comes later). Read from the other tables
        without their locks: each test is one atomic read."""
        # A flight that left its table holds the key in the directory scope (its key
        # lock); in the fleet only until the scope confirms its forget(): after that a
        # new call leads beside it (its lease is lost).
        left_holds = self.left_holds
        for table in (self, *self._kin()):
            if table is not self:
                flight = table.flights.get(tkey)
                if flight is not None and flight.loop is loop and not flight.joined_remote:
                    return True
            if left_holds or tkey in table.forgetting:
                for left in (*table.detached, *table.lingering):
                    if left.tkey == tkey and left.loop is loop and not left.joined_remote:
                        return True
        return False

    def holds(self, flight: Flight) -> bool:
        """``flight``'s work may still run: it is this table's flight of its key, or it
        left the table while its work runs (detached or lingering). Read without the
        lock (by another group's table): each test is one atomic read."""
        return (
            self.flights.get(flight.tkey) is flight
            or flight in self.detached
            or flight in self.lingering
        )

    def unlinger(self, flight: Flight) -> None:
        """A sync attempt of ``flight`` returned (on its own thread): once every one
        left running past its deadline has, the flight no longer lingers."""
        if flight.stragglers is None:
            return
        with self.lock:
            if flight in self.lingering and _stragglers_done(flight):
                self.lingering.discard(flight)

    def detach(self, flight: Flight) -> None:
        """(Wide scopes) ``flight`` is no longer its key's in the scope (a forget() in
        another process): if it is still this table's flight of its key, it leaves the
        table as forget() would take it; the next local call leads a new one."""
        with self.lock:
            if self.flights.get(flight.tkey) is flight:
                self.detached.add(flight)  # first: see forget()
                del self.flights[flight.tkey]

    def close(self) -> list[tuple[Flight, list[Waiter]]]:
        """Mark the group closed and detach every waiter; return them to wake
        with CLOSED, per flight (whose leases are then lost)."""
        with self.lock:
            if self.closed:
                return []
            self.closed = True
            result: list[tuple[Flight, list[Waiter]]] = []
            for flight in [*self.flights.values(), *self.detached]:
                flight.closed = True
                waiters = list(flight.waiters)
                if waiters:
                    flight.waiters = {}
                if flight.fresh:
                    waiters.extend(flight.fresh)
                    flight.fresh = None
                if flight.state is IDLE:
                    flight.claims = 0
                    flight._move(IDLE, DONE)
                    flight.outcome = Outcome.ABANDONED
                result.append((flight, waiters))
            # (Wide scopes) a flight whose work runs on here still holds its key in the
            # scope until it settles: it stays detached, for I6 and run_sync's check
            # (its settle lets go of it).
            running = [f for f, _ in result if f.state is not DONE] if self.wide else []
            self.flights.clear()
            self.detached.clear()
            self.detached.update(running)
            if self.kept is not None:
                self.kept.clear()
            # The errors remembered for __cause__ hold their works' frames: a closed
            # group that is still referenced must not keep them for its life.
            self.causes = None
            return result

    def snapshot(self) -> Any:
        """A Stats snapshot, taken under the lock."""
        with self.lock:
            kept = self.kept
            if kept is not None:
                kept.purge()
                self.stats.kept = len(kept)
            return self.stats.snapshot()

    def recorder(self, timing: bool = False) -> Recorder:
        """A copy of the counters and histograms, for an exporter; ``timing`` starts
        measuring joiners' waits from now on."""
        with self.lock:
            kept = self.kept
            if kept is not None:
                kept.purge()
                self.stats.kept = len(kept)
            if timing:
                self.stats.timing = True
            return self.stats.copy()


__all__ += ["CLOSED", "EXPIRED", "JOINED", "SETTLED", "Outcome", "Role", "Signal", "_expire"]
