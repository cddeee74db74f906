"""The one interface between the engine and a wide scope.

The engine asks a scope only what this module names. A scope is a package of its own
(``directory/``, ``redis/``, :mod:`flightgroup.testing`'s fake one) with a class that
implements :class:`Scope`; its calls implement :class:`ScopeCall`. Each method's
contract is its docstring's first sentence; nothing outside a scope's package names the
scope's concrete classes.

How a flight meets its scope: the first local caller of a key makes the engine
``submit`` it (one request per key per process). The scope answers on the call's inbox
(:mod:`.events`): the work runs here under a :class:`~.events.Lead` token, or the local
flight joined one led elsewhere and ends with what the scope tells. A lead ``bind`` s
each attempt to the call (so the attempt's work hears a lost lease), asks a new token
per retry with ``retry``, and ends with ``land``.

Threads: every method may be called from any thread; a scope does its I/O on its own
background thread (:mod:`.loop`) and never runs user code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Hashable

    from ..engine.flight import Attempt
    from ..errors import UnavailableError
    from .events import Inbox
    from .outcome import SharedOutcome

__all__ = [
    "DetachedNotice",
    "Handed",
    "LeadState",
    "Scope",
    "ScopeCall",
    "key_as_called",
    "key_as_shown",
]


@dataclass(frozen=True, slots=True)
class Handed:
    """What became of a landing (``Scope.land``'s ``done``): the flight may settle here.

    ``fenced``: the scope did not take it, because the flight is no longer this
    leader's (its callers here get LeaseLostError); ``unconfirmed``: the scope could not
    be heard while the lease ran, so it may have taken it (the leader raises this error,
    not LeaseLostError)."""

    fenced: bool = False
    unconfirmed: UnavailableError | None = None


class LeadState:
    """What a lead in a wide scope shares with the work it runs: the running attempt,
    whether the lease is lost, whether the work has ended. ``lock`` guards them: a work
    ends on its own thread while the scope's thread may lose the lease."""

    __slots__ = ("attempt", "lock", "lost", "unreachable", "work_done")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempt: Attempt | None = None
        self.lost = False
        # lost only because the scope could not be reached (no newer flight took it):
        # under on_unavailable="local" its outcome still serves this process's callers
        self.unreachable = False
        self.work_done = False

    def lose(self, only_running: bool = False, *, unreachable: bool = False) -> bool:
        """The lease is lost: the running attempt's work is told. With ``only_running``,
        only if the work has not ended; ``unreachable``: because the scope could not be
        reached. Returns whether it was lost now."""
        with self.lock:
            if self.lost or (only_running and self.work_done):
                return False
            self.lost = True
            self.unreachable = unreachable
            attempt = self.attempt
        if attempt is not None:
            attempt.revoked = True
            attempt.lose()
        return True

    def bind(self, attempt: Attempt) -> None:
        """``attempt``'s work runs under this lead from now on (it hears a loss, also one
        that came before)."""
        with self.lock:
            self.attempt = attempt
            lost = self.lost
        if lost:
            attempt.revoked = True
            attempt.lose()


class DetachedNotice:
    """A call's hook for a forget() elsewhere that took the scope's flight of the call
    away from its key (ADR 0026): the engine's callback, called once."""

    __slots__ = ("on_detached",)

    def __init__(self, on_detached: Callable[[], object] | None) -> None:
        self.on_detached = on_detached

    def detached(self) -> None:
        """The scope said the flight was detached: tell the engine, once."""
        detach, self.on_detached = self.on_detached, None
        if detach is not None:
            detach()


class ScopeCall(Protocol):
    """One submitted call, as the engine sees it (the scope's own object)."""

    @property
    def inbox(self) -> Inbox:
        """Where the scope puts the call's events (:mod:`.events`)."""

    @property
    def lead(self) -> LeadState | None:
        """While this call leads: its lead (``lost`` says the lease is lost); else None."""


class Scope(Protocol):
    """A wide scope: decides lead or join for every process of the group."""

    # Set by the group: called (with forked_reason's text) in a forked child of a
    # started scope; the group then drops its flights there and counts as closed.
    on_fork: Callable[[str], None] | None

    @property
    def identity(self) -> Hashable:
        """What names the group across this process: two scopes of this process with
        equal identities are one group (a work calling its key through either waits for
        itself)."""

    @property
    def kind(self) -> str:
        """The scope's name in metrics and traces: "directory", "fleet", ..."""

    @property
    def label(self) -> str:
        """How the group names its scope to a person (``repr``, logs, warnings)."""

    @property
    def started(self) -> bool:
        """True once the scope's machinery runs (its first call started it): a scope
        never started has nothing to let go of."""

    @property
    def left_flights_hold_keys(self) -> bool:
        """True if a flight that left its key (forgotten, its group closed) still holds
        the key in this scope while its work runs (a key lock); False if the scope lets
        a new flight lead beside it once the forget is confirmed."""

    def submit(
        self,
        key: str,
        *,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> ScopeCall:
        """Ask the scope to lead or join ``key``; the answer comes to the call's inbox.

        ``fresh``: only a flight that begins after this call (or after flight ``after``,
        whose end this process's fresh callers waited for) will do. ``on_detached`` is
        called (from any thread) once a forget() elsewhere took the call's flight away
        from its key. ``loop``: the event loop the call's driver waits on (None: a
        thread); a scope may then answer a join with a Follow, read on that loop.
        Raises at once (and changes nothing) when the scope cannot take calls: closed,
        a refused version, a directory on a network file system."""

    def bind(self, call: Any, attempt: Attempt) -> None:
        """``attempt``'s work runs under ``call``'s lead from now on (it hears a loss)."""

    def retry(self, call: Any) -> None:
        """Ask a new token for the lead's next attempt: its inbox hears Lead or LeaseLost."""

    def land(
        self,
        call: Any,
        outcome: SharedOutcome | None,
        *,
        stragglers: list[threading.Event] | None = None,
        done: Callable[[Handed], None] | None = None,
    ) -> None:
        """Hand the lead's outcome over (None: its lease was lost, nothing lands).

        ``done`` is called once the flight may settle in this process: at once where
        the scope needs no answer, or once the scope took or refused it. ``stragglers``
        are the ends of sync attempts left running past their deadline: a scope with key
        locks keeps the key until every one is set."""

    def withdraw(self, call: Any) -> None:
        """The flight's driver stopped before the call ended: give the call back."""

    def forget(self, key: str) -> None:
        """The next call of ``key`` in the group leads a new flight and a kept outcome is
        dropped; returns once the scope confirmed (raises UnavailableError if it cannot)."""

    def check_key(self, key: str) -> None:
        """Raise ValueError for a key this scope cannot carry, before anything changes."""

    def status(self) -> list[dict[str, Any]]:
        """The flights in progress in the group: key, token, leader_pid, joiners, age_s
        (and host where the scope spans hosts)."""

    def report_left_threads(self, left: int, bound: int) -> None:
        """This group now has ``left`` threads of this process running sync works past
        their deadlines (``bound``: its ``max_deadline_threads``): publish it, so that
        ``left_threads`` in any process of the group sees it (0: nothing to show). Called
        when the count changes, from any thread, never on a call's hot path; never
        raises for a scope that cannot be reached (the next report says it again)."""

    def left_threads(self) -> list[dict[str, Any]]:
        """The processes of the group whose threads run works past their deadlines now:
        pid, left_threads, max_deadline_threads (and host where the scope spans hosts), for
        ``flightgroup status``."""

    def close(self) -> None:
        """Hand over the landings already made, then let go of every resource; the leads
        still running are interrupted for their joiners elsewhere."""


def key_as_shown(key: str) -> str:
    """A key as :func:`key_as_called` gives it, as a person reads it: a decorated
    function's (NUL, namespace, NUL, key) as ``namespace(key)``, any text that is not
    printable as its ``ascii()``. (A plain key that itself starts with a NUL and holds
    another reads the same as a decorated function's once called: it is shown so.)"""
    if key.startswith("\x00"):
        namespace, nul, op = key[1:].partition("\x00")
        if nul and namespace:
            return f"{_printable(namespace)}({_printable(op)})"
    return _printable(key)


def _printable(text: str) -> str:
    return text if text.isprintable() else ascii(text)


def key_as_called(sent: str) -> str:
    """The key as its caller gave it, from the key a scope was sent (``scope_key``,
    ``scope/keys.py``): a plain key that starts with a NUL was sent with one more. A
    decorated function's key stays as sent: NUL, its namespace, NUL, the key."""
    return sent[1:] if sent.startswith("\x00\x00") else sent
