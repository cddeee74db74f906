"""A group's side of the fake (:class:`FakeScope`, the Scope a fake group is made over)
and one call's record (:class:`FakeCall`): what a "process" asks, handed to the fake's
table of flights (:mod:`._table`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from ..errors import GroupClosedError
from ..scope.events import Inbox
from ..scope.interface import DetachedNotice, Handed, LeadState
from ..scope.outcome import SharedOutcome

if TYPE_CHECKING:
    import asyncio

    from ..engine.flight import Attempt
    from ._coordinator import FakeCoordinator
    from ._table import _FakeFlight, _FakeLead

__all__ = ["FakeCall", "FakeScope"]


class FakeCall(DetachedNotice):
    """One submitted call (the :class:`~flightgroup.scope.interface.ScopeCall` of the
    fake): its inbox, and its lead while it leads. ``key``, ``fresh``, ``after`` and
    ``inbox`` are set once at submit; ``_lead``, ``flight`` and ``ended`` are written by
    the coordinator under its lock (``_lead`` once, before its Lead event is put)."""

    __slots__ = ("_lead", "after", "ended", "flight", "fresh", "inbox", "key", "scope")

    def __init__(
        self,
        scope: FakeScope,
        key: str,
        fresh: bool,
        after: int | None,
        on_detached: Callable[[], object] | None,
    ) -> None:
        super().__init__(on_detached)
        self.scope = scope
        self.key = key
        self.fresh = fresh
        self.after = after
        self.inbox = Inbox()
        self._lead: _FakeLead | None = None
        self.flight: _FakeFlight | None = None  # the flight it leads, joined or waits on
        self.ended = False  # it heard its last event (or was withdrawn)

    @property
    def lead(self) -> LeadState | None:
        """While this call leads: its lead; else None."""
        return self._lead


class FakeScope:
    """One group's side of a :class:`FakeCoordinator`: what a "process" asks it. Made
    by :meth:`FakeCoordinator.group` (or :meth:`FakeCoordinator.scope`); implements
    :class:`~flightgroup.scope.interface.Scope`."""

    def __init__(self, coordinator: FakeCoordinator, pid: int) -> None:
        self.coordinator = coordinator
        self._table = coordinator._table  # the fake's decisions, shared by its scopes
        self.pid = pid  # a fake process id: Joined and status() name the leader by it
        self.on_fork: Callable[[str], None] | None = None  # never called (no fork here)
        self.closed = False
        self.killed = False
        self._started = False
        # Calls that have not heard their last event (nor lead): closing refuses them.
        # The coordinator's, under its lock.
        self._waiting: set[FakeCall] = set()

    @property
    def identity(self) -> Hashable:
        """The coordinator's: every group of one fake coordinator is one group (as two
        groups of this process on one directory are)."""
        return ("fake", self.coordinator.serial)

    @property
    def kind(self) -> str:
        """The scope's name in metrics and traces: "fake"."""
        return "fake"

    @property
    def label(self) -> str:
        """How a person reads the scope: its coordinator's number and the fake pid."""
        return f"fake scope #{self.coordinator.serial} (pid {self.pid})"

    @property
    def started(self) -> bool:
        """True once the group made its first call."""
        return self._started

    @property
    def left_flights_hold_keys(self) -> bool:
        """False: the fake has no key locks; once a forget is confirmed (at once), a new
        flight of the key leads beside the old one, as in the fleet scope."""
        return False

    def submit(
        self,
        key: str,
        *,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> FakeCall:
        """Ask the fake to lead or join ``key``: answered in the inbox before this
        returns (unless held). Raises GroupClosedError once this scope closed,
        UnavailableError while the fake is unreachable or this "process" was killed,
        ValueError for a key over the fake's ``max_key_length``. ``loop`` is not used:
        the fake answers every call in its inbox."""
        return self._table.submit(self, key, fresh, after, on_detached)

    def bind(self, call: Any, attempt: Attempt) -> None:
        """``attempt``'s work runs under ``call``'s lead (it hears a loss)."""
        lead = call.lead
        assert lead is not None
        lead.bind(attempt)

    def retry(self, call: Any) -> None:
        """A new token for the lead's next attempt: Lead(token), or LeaseLost."""
        self._table.retry(call)

    def land(
        self,
        call: Any,
        outcome: SharedOutcome | None,
        *,
        stragglers: list[threading.Event] | None = None,
        done: Callable[[Handed], None] | None = None,
    ) -> None:
        """Take the lead's outcome (None: its lease was lost, nothing lands); ``done``
        is told once the fake took it (Handed()) or refused it (fenced: the flight is no
        longer this lead's). ``stragglers`` are not waited for: no key lock."""
        self._table.land(call, outcome, done)

    def withdraw(self, call: Any) -> None:
        """The driver stopped: a lead's flight ends for its joiners (NoOutcome), a
        joiner leaves its flight."""
        self._table.withdraw(call)

    def forget(self, key: str) -> None:
        """The next call of ``key`` leads a new flight; the running one goes on,
        detached, for its callers (told by ``on_detached``); a kept outcome is dropped.
        Raises UnavailableError while the fake is unreachable."""
        self._table.forget(self, key)

    def check_key(self, key: str) -> None:
        """Raises ValueError for a key over the coordinator's ``max_key_length``."""
        limit = self.coordinator.max_key_length
        if limit is not None and len(key) > limit:
            raise ValueError(f"the key ({len(key)} characters) is over the fake's limit ({limit})")

    def status(self) -> list[dict[str, Any]]:
        """The flights in progress (key, token, leader_pid, joiners, age_s); raises
        UnavailableError while the fake is unreachable, GroupClosedError once closed."""
        if self.closed:
            raise GroupClosedError()
        return self._table.status(self)

    def report_left_threads(self, left: int, bound: int) -> None:
        """This "process" now has ``left`` threads past their deadlines (of ``bound``):
        kept by the coordinator (dropped at 0 and when this scope closes)."""
        self._table.report_left(self, left, bound)

    def left_threads(self) -> list[dict[str, Any]]:
        """The "processes" with threads past their deadlines: pid, left_threads,
        max_deadline_threads. Raises GroupClosedError once closed."""
        if self.closed:
            raise GroupClosedError()
        return self._table.left_threads()

    def close(self) -> None:
        """The flights this scope leads whose work has not ended are interrupted for
        their joiners elsewhere; its calls still waiting are refused (GroupClosedError),
        and so are its later submits. Returns at once: every landing was taken already."""
        self._table.close(self, killed=False)
