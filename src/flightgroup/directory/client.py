"""The directory arbiter: how one group takes part in its directory (the Scope of
:mod:`flightgroup.scope.interface`).

One background thread per group (:mod:`flightgroup.scope.loop`) runs an event loop with
the connection to the coordinator (and the coordinator itself while this group holds
the election). The arbiter is the Scope's surface: it registers the group's calls and
hands what happens to them to the parts it builds on, each given the group's shared
state (:mod:`.state`) and the few calls of another part it needs:

- :mod:`.election`: the campaign for ``flight.lock`` and, once won, the term it serves;
- :mod:`.connection`: the channel to the coordinator, reconnects and what is resent;
- :mod:`.answers`: the coordinator's answers, routed to calls, leads and waiters;
- :mod:`.keylocks`: a lead's key lock (opened ahead, taken, waited for, released);
- :mod:`.leases`: a lead's lease (retries, loss, landing until acknowledged);
- :mod:`.outage`: refusals, an election that failed, no coordinator for too long;
- :mod:`.closing`: the close, once landings are acknowledged;
- :mod:`.calls`: the records of a call and a lead.

A local flight asks the arbiter once (``submit``): it leads (and holds the key
lock while its work runs), joins a flight led elsewhere, or is served a kept
outcome. Answers reach the flight's driver through an ``Inbox``, on its own
loop or thread.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .._log import log
from ..errors import GroupClosedError, UnavailableError, renewed
from ..scope.events import Inbox
from ..scope.interface import Handed, key_as_called
from ..scope.loop import BackgroundLoop, closed_in_fork
from ..scope.outcome import SharedOutcome
from . import fs, keylocks, wire
from .answers import Answers
from .calls import Call
from .closing import Closing
from .connection import Connection, key_too_long, request_size, send_run
from .election import Election, campaign_for
from .leases import Leases
from .outage import Outage
from .state import GroupState

if TYPE_CHECKING:
    from ..engine.flight import Attempt

__all__ = ["Call", "DirectoryArbiter"]

_serials = itertools.count(1)  # numbers the groups of this process (files of left threads)


class DirectoryArbiter:
    """Lead or join for the wider scope of a directory group (see the module)."""

    def __init__(
        self,
        directory: str,
        *,
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        reconnect_timeout: float = 5.0,
        rejoin_window: float = 5.0,
    ) -> None:
        self._background = BackgroundLoop("directory", self._forked)
        state = self._state = GroupState(
            directory, self._background, max_frame=max_frame,
            reconnect_timeout=reconnect_timeout, rejoin_window=rejoin_window,
        )
        self.directory = state.directory
        self._max_frame = max_frame
        self._leases = Leases(state, check_closed=lambda: closing.check_closed())
        self._key_locks = keylocks.KeyLocks(state, lose=self._leases.lose)
        self._outage = Outage(state, self._leases)
        self._election = Election(state, fail_all=self._outage.fail_all)
        self._answers = Answers(state, leases=self._leases, key_locks=self._key_locks)
        self._connection = Connection(
            state, on_frames=self._answers.on_frames, refused=self._outage.refused,
            give_up=self._outage.give_up,
        )
        closing = self._closer = Closing(state, leases=self._leases, election=self._election)
        # Set when the first close() returns: a second one (another thread, a with-block
        # after an explicit close) returns no sooner (docs/api.md: once landings are handed over).
        self._close_returned = threading.Event()
        self._serial = next(_serials)  # names this group's file of left threads
        # Orders the reports of threads left past a deadline with close(), which removes
        # the file: none is written after it.
        self._left_lock = threading.Lock()
        # Called in a forked child of a started group (its group drops its flights).
        self.on_fork: Callable[[str], None] | None = None

    # -- starting ---------------------------------------------------------------

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        """The group's loop, started (and the election begun) by the first call."""
        return self._background.ensure_started(
            self._setup,
            check=self._check_startable,
            prepare=self._check_directory,
            started=lambda: campaign_for(self._election),
        )

    def _check_startable(self) -> None:
        if self._state.fatal is not None:
            raise renewed(self._state.fatal)
        if self._state.closing:
            raise GroupClosedError()

    def _check_directory(self) -> None:
        """A directory that cannot serve (a network file system, no permission) fails
        every call of the group, this one first."""
        try:
            fs.check_local(self.directory)
            fs.ensure_directory(self.directory)
        except BaseException as exc:
            self._state.fatal = exc
            raise

    def _setup(self, loop: asyncio.AbstractEventLoop) -> None:
        self._state.kick = asyncio.Event()
        self._closer.maintainer = loop.create_task(self._connection.run())

    # -- what drivers call (any thread) -----------------------------------------

    @property
    def identity(self) -> Hashable:
        """The directory's real path: every spelling of it is one group."""
        return ("directory", os.path.realpath(self.directory))

    @property
    def kind(self) -> str:
        return "directory"

    @property
    def label(self) -> str:
        return f"directory {self.directory!r}"

    @property
    def started(self) -> bool:
        """True once the first call started the group's thread."""
        return self._background.started

    @property
    def left_flights_hold_keys(self) -> bool:
        """True: a flight's key lock is held until its work ends, forgotten or not."""
        return True

    def submit(
        self,
        key: str,
        *,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Call:
        """Ask the directory to lead or join ``key``; events go to the call's inbox.
        ``fresh``: only a flight that begins after the call, or after flight ``after``.
        ``on_detached``: called on the group's thread if a forget() elsewhere detaches
        the flight this call leads or joined. ``loop`` is not used: a joiner's outcome
        comes over the group's channel.

        The request goes out from this thread when connected. While it travels, this
        thread opens the key's lock file (creating it costs a journal write), so a
        lead finds it open."""
        state = self._state
        if state.fatal is not None:
            raise renewed(state.fatal)
        if state.election_error is not None and state.channel is None:
            raise renewed(state.election_error)
        if state.given_up and state.channel is None:
            raise self._outage.out_of_reach()  # no call waits on an outage already seen out
        self.check_key(key)
        self._ensure_started()
        with state.send_lock:
            if state.closing:
                raise GroupClosedError()
            # Again under the lock: the election may have failed since, and its
            # fail_all (under this lock too) may have run before this call was in.
            if state.fatal is not None:
                raise renewed(state.fatal)
            if state.election_error is not None and state.channel is None:
                raise renewed(state.election_error)
            state.next_id += 1
            call = Call(state.next_id, key, fresh, Inbox(), after, on_detached)
            state.calls[call.id] = call
            channel = state.channel
            if channel is not None:
                send_run(call, channel, self._max_frame)
        if channel is None:
            # Disconnected (maybe refused by another version): try again now; the
            # answer decides this call (ProtocolVersionError while refused).
            self._background.post(state.kick_now)
        taken = keylocks.open_ahead(call, self.directory)
        if taken is not None:  # told to lead while it opened: it takes the lead here
            self._key_locks.take(call, *taken)
        return call

    def bind(self, call: Call, attempt: Attempt) -> None:
        """The attempt whose work runs under ``call``'s lead (it hears a loss)."""
        lead = call.lead
        assert lead is not None
        lead.bind(attempt)

    def retry(self, call: Call) -> None:
        """Ask a new token for the next attempt; the inbox hears LEAD or LOST."""
        self._background.post(self._leases.retry, call)

    def land(
        self,
        call: Call,
        outcome: SharedOutcome | None,
        *,
        stragglers: list[threading.Event] | None = None,
        done: Callable[[Handed], None] | None = None,
    ) -> None:
        """The flight ended: hand ``outcome`` over (None: nothing to land, the lease
        was lost). Sent from the work's own thread, like a run request; ``done`` is told
        once a coordinator took it (its ``ack``, or ``taken`` when the ack waits for the
        joiners), or the lease is lost (ADR 0040): a leader never settles on a landing
        that may reach nobody. The key lock is freed once the coordinator
        acknowledged (kept until then for a resend) and every attempt's work has
        returned: ``stragglers`` are the ends of sync attempts still running past their
        deadline (the key never runs beside them)."""
        self._leases.land(call, outcome, stragglers=stragglers, done=done)

    def withdraw(self, call: Call) -> None:
        """The flight's driver stopped before the call ended: give it back."""
        if not self._background.post(self._withdraw, call):
            self._withdraw(call)  # the group's loop is gone: nothing else runs here

    def _withdraw(self, call: Call) -> None:
        state = self._state
        if state.calls.pop(call.id, None) is None:
            return
        lead = call.lead
        if lead is not None:
            state.leads.pop(call.id, None)
            with lead.lock:
                lead.abandoned = True
            lead.release()
        else:
            keylocks.drop_fd(call)  # the key's file it opened ahead, in case it led
        # A lead reasserted after a failover is known to the coordinator although its
        # run was never sent on this connection: it is cancelled too.
        if call.sent or lead is not None:
            state.send(wire.cancel_frame(call.id))

    def check_key(self, key: str) -> None:
        """Raises ValueError for a key whose request would not fit in a frame (a
        coordinator would drop the connection, and every flight on it)."""
        # A character takes at most 12 bytes of ASCII JSON: only a long key is measured.
        if 12 * len(key) + 256 > self._max_frame and request_size(key) > self._max_frame:
            raise key_too_long(key, self._max_frame)

    def forget(self, key: str, timeout: float = 5.0) -> None:
        """Tell the coordinator: the next call of ``key`` leads a new flight. Returns
        once it confirmed, so a later call anywhere sees it (connecting first if this
        group is not connected; sent again if the connection drops meanwhile).

        Raises UnavailableError when no coordinator confirmed it within ``timeout``
        (then a call elsewhere may still join the flight); a closed group forgets
        only in its own table, and returns."""
        state = self._state
        if state.closing:
            return
        self._ensure_started()
        end = time.monotonic() + timeout
        while not state.closing and (left := end - time.monotonic()) > 0:
            if not state.connected_now.wait(left):
                break
            waiter: Future[Any] = Future()
            with state.send_lock:
                channel = state.channel
                if channel is None:
                    continue
                state.next_id += 1
                id = state.next_id
                state.waiters[id] = waiter
                channel.send(wire.forget_frame(key, id))
            try:
                waiter.result(max(0.0, end - time.monotonic()))
                return
            except Exception:  # the connection dropped: the next coordinator is told
                continue
        if not state.closing:
            raise UnavailableError(
                f"no coordinator confirmed the forget of {key!r} within {timeout:g} s; "
                "other processes may still join its flight"
            )

    def status(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The flights in progress in the directory (a read-only request). Raises
        UnavailableError when no coordinator answers within ``timeout``, and
        GroupClosedError once the group is closed."""
        state = self._state
        if state.closing:
            raise GroupClosedError()
        self._ensure_started()
        waiter: Future[Any] = Future()

        def ask() -> None:
            with state.send_lock:
                state.next_id += 1
                id = state.next_id
            if state.channel is None:
                waiter.set_exception(UnavailableError("no coordinator is connected"))
                return
            state.waiters[id] = waiter
            state.send(wire.status_frame(id))

        if not self._background.post(ask):
            raise GroupClosedError()
        try:
            flights: list[dict[str, Any]] = waiter.result(timeout)
        except TimeoutError:  # concurrent.futures' is the builtin since 3.11
            # (its waiter goes with the answer, or with the connection)
            raise UnavailableError(
                f"no coordinator answered the status request within {timeout:g} s"
            ) from None
        for flight in flights:
            if isinstance(flight.get("key"), str):
                flight["key"] = key_as_called(flight["key"])
        return flights

    # -- closing ----------------------------------------------------------------

    def report_left_threads(self, left: int, bound: int) -> None:
        """This group's threads left past a deadline, in its file under
        ``state/left-threads`` while there are any (a failed write is logged)."""
        with self._left_lock:
            if self._state.closing:
                return
            self._write_left(left, bound)

    def _write_left(self, left: int, bound: int) -> None:
        path = fs.left_threads_path(self.directory, f"{os.getpid()}-{self._serial}")
        try:
            fs.write_left_threads(path, os.getpid(), left, bound)
        except OSError as exc:
            log.warning("%s: cannot write the count of threads left past a deadline (%s)",
                        self.directory, exc.strerror or exc)

    def left_threads(self) -> list[dict[str, Any]]:
        """The live processes of the directory whose threads run works past their
        deadlines (read from their files; nothing is changed)."""
        if self._state.closing:
            raise GroupClosedError()
        return [dict(entry) for entry in fs.read_left_threads(self.directory)]

    def close(self) -> None:
        """Wait (at most ``reconnect_timeout``) until every landing made here was
        acknowledged, then disconnect; stop coordinating if this group does. Works
        still running keep their key locks until they end."""
        state = self._state
        # (Under the start lock: no call starts the group once it closes. Under the send
        # lock: submit() checks it there.)
        with self._left_lock, self._background.lock, state.send_lock:
            again = state.closing
            state.closing = True
        if not again and self._background.started:
            self._write_left(0, 0)  # a closed group shows nothing
        if again:
            if not self._background.on_its_thread():
                self._close_returned.wait(state.reconnect_timeout + 10)
            return
        try:
            self._closer.run()
        finally:
            self._close_returned.set()

    def _forked(self, why: str, inherited: BackgroundLoop) -> None:
        """(In a forked child of a started group, see BackgroundLoop) the group's threads
        were not copied: it raises at once here, instead of waiting on a loop that never
        runs (its descriptors were let go, see forked.py)."""
        state = self._state
        state.fatal = closed_in_fork(why)
        state.closing = True  # close() has nothing to wait for
        self._close_returned = threading.Event()
        self._close_returned.set()
        state.kick = None
        state.channel = state.coordinator = None
        self._election.campaigner = None
        if self.on_fork is not None:
            self.on_fork(why)
