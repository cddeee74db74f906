"""One key's flight: its states, its attempts, its waiters and how they are woken.

The table of flights that keeps the invariants below is ``engine/table.py``.

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
import functools
from _thread import LockType, allocate_lock
from asyncio import events
from collections.abc import Callable, Hashable
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Generic, NamedTuple, TypeVar

from ..lease import Lease
from ..policy import NO_POLICY, FlightPolicy

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "CLOSED",
    "ERROR",
    "EXPIRED",
    "INTERRUPTED",
    "JOIN",
    "JOINED",
    "KEPT",
    "LEAD",
    "LEADING",
    "LOST",
    "SETTLED",
    "TAKE",
    "TIMEOUT",
    "VALUE",
    "WAIT_END",
    "Attempt",
    "Counts",
    "Flight",
    "Outcome",
    "Result",
    "Role",
    "Signal",
    "State",
    "ThreadWaiter",
    "make_result",
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


make_result: Callable[[tuple[Any, bool, int]], Result[Any]] = functools.partial(
    tuple.__new__, Result
)
"""``make_result((value, joined, token))``: a Result made by ``tuple.__new__`` in C,
without the Python frames of the named tuple's ``__new__`` or ``_make`` (the miss path
makes one per call)."""


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


VALUE: Final = Outcome.VALUE
ERROR: Final = Outcome.ERROR
TIMEOUT: Final = Outcome.TIMEOUT
INTERRUPTED: Final = Outcome.INTERRUPTED
LOST: Final = Outcome.LOST
# (Module constants for the hot paths: on Python 3.11 reading an Enum member off its
# class costs about ten times a global's read.)


class Counts(Enum):
    """How a settled flight counts in the stats. Its table decides, as it learns why
    (``close``, a fork, a wide scope that could not serve the call), and ``settle``
    reads it: one count for every table, no scope's case in it."""

    OUTCOME = "outcome"  # by its outcome: a flight, failed, interrupted or lost
    CLOSED = "closed"  # its group closed while it ran: interrupted and its lease lost
    NOTHING = "nothing"  # no flight and no join (a wide scope could not serve it)
    FORKED = "forked"  # copied into a forked child: counted out of in_flight at the fork


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


LEAD: Final = Role.LEAD
LEADING: Final = Role.LEADING
JOIN: Final = Role.JOIN
WAIT_END: Final = Role.WAIT_END
TAKE: Final = Role.TAKE
KEPT: Final = Role.KEPT


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


def _share_fields(cls: type[object], *set_by_init: str) -> None:
    """Let every instance of ``cls`` hold its fields beside it, without a dict of its
    own, whichever of them it writes and in whatever order.

    CPython (3.11+) stores an object's attributes by the names in its class's shared
    keys, and a class stops taking new names there once a few dozen instances were made;
    an instance that then writes a name not among them gets a dict of its own (300-450 B).
    Some fields are written on some paths only (a leader's waiter once its work
    suspended, an attempt's timer under a deadline, its lease when the work asks), so a
    process whose first flights took other paths would hold such a dict for every
    in-flight key. One throwaway instance that writes each field as the class is made
    puts them all among the shared keys (29 at most: CPython's limit is 30)."""
    fields = [
        name
        for name, value in vars(cls).items()
        if not name.startswith("__")
        and not callable(value)
        and not isinstance(value, (property, classmethod, staticmethod))
    ]
    names = (*set_by_init, *fields)
    # CPython keeps 30 names per class, the throwaway instance's own making takes one.
    assert len(names) <= 29, f"{cls.__name__} has {len(names)} fields: some would need a dict"
    # Every name its methods write is among them (3.13+ lists those names).
    missing = set(getattr(cls, "__static_attributes__", ())) - set(names)
    assert not missing, f"{cls.__name__} writes {sorted(missing)} without a class default"
    probe = object.__new__(cls)
    for name in names:
        object.__setattr__(probe, name, getattr(cls, name, None))


class Attempt:
    """One attempt of a flight's work: its fencing token and its lease.

    A flight has one attempt, or several under a Retry policy; each gets a new
    token. The context variable of a running work holds its attempt, so a work
    left running past its deadline still sees its own (lost) lease.
    """

    # Class-level defaults, as Flight's: a new attempt costs two assignments.
    lease: Lease | None = None
    lost = False
    revoked = False  # (wide scopes) lost to the scope, not to a deadline or close
    timed_out = False
    timer: asyncio.TimerHandle | None = None  # an async attempt's deadline

    def __init__(self, flight: Flight, token: int) -> None:
        self.flight = flight
        self.token = token

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


_share_fields(Attempt, "flight", "token")


class Flight:
    """One run of the work for one key, from its start to its outcome.

    Fields written under the table lock only: ``state``, ``waiters``, ``leading``,
    ``fresh``, ``claims``, ``joiners``, ``next``. Outcome fields (``outcome``, ``value``,
    ``error``, ``data``) are written once, under the lock, before ``state``
    becomes DONE, and read by callers only after they were signalled (or saw
    DONE under the lock). ``parent``, ``task`` and ``loop`` are written by the
    leader when it starts the work, before anyone can read them.

    No ``__slots__``: the class-level defaults below make a new flight cost four
    assignments on the miss path; most flights never touch the other fields. What a
    wide scope's flight adds lives in its subclass (``scope.table.WideFlight``).
    """

    # waiter -> None, in wake order: the joiners. A shared empty dict until the first
    # joiner comes (copy on first write).
    waiters: dict[Waiter, None] = {}  # noqa: RUF012 - replaced, never mutated
    # The leader's waiter while it waits for a signal (I3, as a joiner's in ``waiters``):
    # a slot of its own, so that a flight nobody joined holds no dict.
    leading: Waiter | None = None
    fresh: list[Waiter] | None = None  # fresh callers waiting for the end
    claims = 0  # pending claims on an IDLE flight (I4)
    joiners = 0
    next: Flight | None = None  # the flight after this one, for its fresh callers
    # Ended interrupted under a policy with ``takeover``: its joiners that hold a claim
    # on ``next`` instead of raising FlightInterruptedError (FlightTable.settle), and
    # how many interrupted flights before it its callers took over.
    taken_over: frozenset[Waiter] = frozenset()
    takeovers = 0
    outcome: Outcome | None = None
    value: Any = None
    error: BaseException | None = None
    data: bytes | None = None  # the encoded value, with a codec
    failure: tuple[str, str, str, str] | None = None  # made once for all joiners
    joined_result: Result[Any] | None = None  # made once for all joiners (_deliver)
    parent: Flight | None = None  # the flight whose work made this call (I6)
    attempt: Attempt | None = None  # the running (or last) attempt
    policy: FlightPolicy = NO_POLICY  # the leader's, for the flight's whole life
    leader_waiter: Waiter | None = None  # the leader's waiter, once it waited (identity)
    closed = False  # its waiters were woken by the group's close()
    loop: asyncio.AbstractEventLoop | None = None  # where an async work runs
    task: asyncio.Task[None] | None = None  # the work's own task: the group owns it
    started = 0  # perf_counter_ns() when the work started
    # While stats time waits: how many joiners were timed, and their arrival times' sum.
    timed = 0
    joined_ns = 0
    # how it counts once settled (its table sets it; FORKED: copied into a forked child,
    # where it left its table, so its settle there is not counted again)
    counts = Counts.OUTCOME

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


_share_fields(Flight, "tkey", "key", "token", "state")


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


def signal_of(flight: Flight, fresh_of: Flight | None, waiter: Waiter) -> Signal | Flight:
    """The signal ``waiter`` of ``flight`` was handed, read from the flight itself
    (valid once the waiter was detached, I3). ``fresh_of`` is the flight whose end
    a fresh caller waited for, else None. (A wide table reads more: WideTable.signal_of.)"""
    if fresh_of is not None:
        following = fresh_of.next
        return following if following is not None else CLOSED
    if flight.taken_over and waiter in flight.taken_over:  # it takes the flight over
        following = flight.next
        return following if following is not None else CLOSED
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
            try:
                fut.set_result(signal)
            except asyncio.InvalidStateError:  # cancelled: its caller withdraws it
                continue
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
