"""The directory arbiter: how one group takes part in its directory (the Scope of
:mod:`flightgroup.scope.interface`).

One background thread per group (:mod:`flightgroup.scope.loop`) runs an event loop with
the connection to the coordinator (and the coordinator itself while this group holds
the election). The arbiter owns the group's calls and leads and the answers to them; it
builds on:

- :mod:`.election`: the campaign for ``flight.lock`` and, once won, the term it serves;
- :mod:`.connection`: the channel to the coordinator, reconnects and what is resent;
- :mod:`.keylocks`: a lead's key lock (opened ahead, taken, waited for, released);
- :mod:`.leases`: a lead's lease (retries, loss, landing until acknowledged);
- :mod:`.calls`: the records of a call and a lead.

A local flight asks the arbiter once (``submit``): it leads (and holds the key
lock while its work runs), joins a flight led elsewhere, or is served a kept
outcome. Answers reach the flight's driver through an ``Inbox``, on its own
loop or thread.

Field ownership: the arbiter's dicts are touched only on the background loop, except
under ``_send_lock`` (see :mod:`.calls` for the fields of a call and a lead).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .._forksafe import renew_after_fork
from .._log import DigestOf, log
from ..errors import (
    FlightInterruptedError,
    GroupClosedError,
    ProtocolVersionError,
    UnavailableError,
    ValueTooLargeError,
    renewed,
)
from ..scope.events import (
    Inbox,
    Joined,
    Landed,
    LeaseLost,
    NoOutcome,
    Refused,
    ScopeEvent,
)
from ..scope.interface import Handed, key_as_called
from ..scope.loop import BackgroundLoop, closed_in_fork
from ..scope.outcome import Interrupted, SharedOutcome
from . import fs, keylocks, wire
from .calls import Call, DirectoryLead, heard
from .connection import (
    Channel,
    Connection,
    handshake,
    key_too_long,
    request_size,
    send_run,
)
from .coordinator import Coordinator
from .election import Election, campaign_for, park
from .leases import Leases

if TYPE_CHECKING:
    from ..engine.flight import Attempt
    from .election import _Campaign

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
        self.directory = os.path.abspath(directory)
        self._max_frame = max_frame
        self._reconnect_timeout = reconnect_timeout
        self._rejoin_window = rejoin_window
        self._campaign_lock = threading.Lock()
        # The group's thread; its lock also orders close() with a start.
        self._background = BackgroundLoop("directory", self._forked)
        self._fatal: BaseException | None = None  # every call raises it (bad directory)
        # This process's last election failed (the epoch could not be written or told,
        # the socket not served): while no coordinator is connected, calls raise it at
        # once (it says what to fix); it is tried again every _ELECTION_RETRY seconds,
        # and the first connection to a coordinator clears it.
        self._election_error: BaseException | None = None
        self._refusal: BaseException | None = None  # new calls raise it (another version)
        self._next_id = 0
        self._calls: dict[int, Call] = {}
        self._leads: dict[int, DirectoryLead] = {}
        self._channel: Channel | None = None
        # Guards the channel, call registration and ``Call.sent`` (callers send their
        # own run requests from their threads; the loop resends after a reconnect).
        self._send_lock = threading.Lock()
        self._connected_now = threading.Event()  # set while a channel is up
        self._kick: asyncio.Event | None = None
        # The connection's keeper, held so that closing ends it (its wait on a channel
        # that flush_and_close() shut is never answered) rather than leave it pending.
        self._maintainer: asyncio.Task[None] | None = None
        self._coordinator: Coordinator | None = None
        self._closing = False
        self._given_up = False  # no coordinator for reconnect_timeout: calls fail fast
        self._down_since = 0.0  # time.monotonic() when the outage that gave up began
        # Requests answered to a thread that waits (status, forget): id -> its future.
        self._waiters: dict[int, Future[Any]] = {}
        self._closed_future: Future[None] = Future()
        # Set when the first close() returns: a second one (another thread, a with-block
        # after an explicit close) returns no sooner (docs/api.md: once landings are handed over).
        self._close_returned = threading.Event()
        self._campaigner: _Campaign | None = None  # its election thread's state
        self._election = Election(self)
        self._key_locks = keylocks.KeyLocks(self)
        self._leases = Leases(self)
        self._close_by = 0.0  # closing waits for acks until then
        self._serial = next(_serials)  # names this group's file of left threads
        # Orders the reports of threads left past a deadline with close(), which removes
        # the file: none is written after it.
        self._left_lock = threading.Lock()
        self._finishing = False
        # Called in a forked child of a started group (its group drops its flights).
        self.on_fork: Callable[[str], None] | None = None
        # Held by another thread at a fork, a copied lock would stay held in the child.
        renew_after_fork(self, "_send_lock")
        renew_after_fork(self, "_campaign_lock")

    # -- starting ---------------------------------------------------------------

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        """The group's loop, started (and the election begun) by the first call."""
        return self._background.ensure_started(
            self._setup,
            check=self._check_startable,
            prepare=self._check_directory,
            started=lambda: campaign_for(self),
        )

    def _check_startable(self) -> None:
        if self._fatal is not None:
            raise renewed(self._fatal)
        if self._closing:
            raise GroupClosedError()

    def _check_directory(self) -> None:
        """A directory that cannot serve (a network file system, no permission) fails
        every call of the group, this one first."""
        try:
            fs.check_local(self.directory)
            fs.ensure_directory(self.directory)
        except BaseException as exc:
            self._fatal = exc
            raise

    def _setup(self, loop: asyncio.AbstractEventLoop) -> None:
        self._kick = asyncio.Event()
        self._maintainer = loop.create_task(self._maintain())

    # -- the election -----------------------------------------------------------

    def _campaign(self) -> None:
        """The election thread of this group (see election._Campaign)."""
        campaign = self._campaigner
        assert campaign is not None
        campaign.run()

    # -- the connection ---------------------------------------------------------

    async def _maintain(self) -> None:
        """Keep a connection to the coordinator of the moment, until closed (see
        connection.Connection)."""
        await Connection(self).run()

    async def _connect(self, wait: float = wire.HANDSHAKE_TIMEOUT) -> socket.socket:
        """Connect and shake hands, waiting up to ``wait`` s for the coordinator's line."""
        return await handshake(self.directory, wait)

    def _send(self, frame: bytes) -> None:
        channel = self._channel
        if channel is not None:
            channel.send(frame)

    def _refused(self, exc: ProtocolVersionError) -> None:
        """A coordinator of another version holds the election: new calls fail."""
        self._refusal = exc
        for call in self._take_unled(lambda call: not call.joined):
            _finish(call, Refused(renewed(exc)))

    def _give_up(self, down: float) -> None:
        """No coordinator of our version for ``down`` s (over ``reconnect_timeout``):
        every lease of this process is lost, and its joined calls are interrupted."""
        if self._given_up:
            return
        self._down_since = time.monotonic() - down
        self._given_up = True
        # The calls that waited through the outage; one made while the leases are lost
        # below (their works wake, their callers go on) is not failed with them.
        waited = self._take_unled()
        for lead in list(self._leads.values()):
            self._lose(lead, "no coordinator could be reached", unreachable=True)
        for call in waited:
            if call.joined:
                _finish(call, NoOutcome("no coordinator could be reached"))
            else:
                error = self._refusal or UnavailableError(
                    f"no coordinator of {self.directory!r} answered for {down:.1f} s "
                    f"(reconnect_timeout={self._reconnect_timeout:g})"
                )
                _finish(call, Refused(renewed(error)))

    def _out_of_reach(self) -> BaseException:
        """What a new call raises while no coordinator of our version has answered for
        longer than ``reconnect_timeout`` (the connection keeps trying, as a probe: the
        first coordinator that answers ends it): the refusal of another version's, if
        one holds the election, else UnavailableError."""
        if self._refusal is not None:
            return renewed(self._refusal)
        return UnavailableError(
            f"no coordinator of {self.directory!r} has answered for "
            f"{time.monotonic() - self._down_since:.1f} s "
            f"(reconnect_timeout={self._reconnect_timeout:g}); still trying"
        )

    def _fail_all(self, exc: BaseException) -> None:
        for call in self._take_unled():
            _finish(call, Refused(renewed(exc)))

    def _take_unled(self, only: Callable[[Call], bool] | None = None) -> list[Call]:
        """Remove the calls that lead nothing (and pass ``only``); under the send lock,
        so that none of them is published as a lead meanwhile (see KeyLocks.take)."""
        with self._send_lock:
            calls = [
                call for call in self._calls.values()
                if call.lead is None and (only is None or only(call))
            ]
            for call in calls:
                del self._calls[call.id]
        return calls

    # -- the answers (on the loop) ------------------------------------------------

    def _on_frames(self, frames: list[tuple[dict[str, Any], bytes | None]]) -> None:
        for header, payload in frames:
            if header["op"] == wire.SKIPPED:
                self._skipped(header)
                continue
            try:
                answer = wire.parse_answer_frame(header, payload)
            except wire.WireError as exc:
                channel = self._channel
                if channel is not None:
                    channel._lost(f"a bad answer: {exc}")
                return
            self._answer(answer)

    def _skipped(self, header: dict[str, Any]) -> None:
        """An answer over this group's max_frame_bytes was skipped: its request fails
        (a joiner's call with ValueTooLargeError), and nothing else."""
        id, size, limit = header["id"], header["size"], self._max_frame
        log.warning("%s: the coordinator's %r answer (%d bytes) is over this group's "
                    "max_frame_bytes (%d)", self.directory, header["of"], size, limit)
        call = self._calls.get(id) if id is not None else None
        if call is not None and call.lead is None:
            del self._calls[id]
            _finish(call, Refused(ValueTooLargeError(call.key, size, limit)))
            return
        waiter = self._waiters.pop(id, None) if id is not None else None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ValueError(
                f"the coordinator's answer ({size} bytes) is over this group's "
                f"max_frame_bytes ({limit})"
            ))

    def _answer(self, answer: wire.Answer) -> None:
        if isinstance(answer, wire.Lead):
            self._on_lead(answer.id, answer.token)
        elif isinstance(answer, wire.Joined):
            self._on_joined(answer)
        elif isinstance(answer, wire.Landed):
            call = self._calls.pop(answer.id, None)
            if call is not None:
                keylocks.drop_fd(call)
                call.inbox.put(Landed(answer.token, answer.outcome, answer.kept))
        elif isinstance(answer, wire.InterruptedAnswer):
            call = self._calls.pop(answer.id, None)
            if call is not None:
                _finish(call, NoOutcome(answer.reason))
        elif isinstance(answer, wire.Detached):
            call = self._calls.get(answer.id)
            if call is not None:
                log.debug("%s %s: its flight was detached", self.directory,
                          DigestOf(call.key))
                call.detached()
        elif isinstance(answer, wire.Taken):
            lead = self._leads.get(answer.id)
            if lead is not None and lead.landing is not None:
                self._leases.taken(lead)
        elif isinstance(answer, wire.Ack) and answer.id in self._waiters:
            self._waiters.pop(answer.id).set_result(None)  # a forget was done
        elif isinstance(answer, wire.Ack):
            lead = self._leads.get(answer.id)
            if lead is not None and lead.landing is not None:
                self._leases.acked(lead)
        elif isinstance(answer, wire.Rejected):
            self._on_rejected(answer)
        elif isinstance(answer, wire.StatusAnswer):
            waiter = self._waiters.pop(answer.id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(answer.flights)
        elif isinstance(answer, wire.ErrorAnswer):
            self._on_error(answer)

    def _on_joined(self, answer: wire.Joined) -> None:
        call = self._calls.get(answer.id)
        if call is None or call.lead is not None:
            return
        keylocks.drop_fd(call)
        first = not call.joined
        if not first and answer.token != call.token:  # its flight retried
            call.earlier = heard(call.earlier, call.token, answer.token)
        call.joined, call.token = True, answer.token
        if first:
            log.debug("%s %s: join, token %d (leader pid %d)", self.directory,
                      DigestOf(call.key), answer.token, answer.pid)
            call.inbox.put(Joined(answer.token, answer.pid, answer.age))

    def _on_rejected(self, answer: wire.Rejected) -> None:
        with self._send_lock:  # in one step with KeyLocks.take's publishing
            lead = self._leads.get(answer.id)
            call = self._calls.get(answer.id) if lead is None else None
            if call is not None and call.lead is None:
                # A lead told while its caller opened the key's file, reasserted
                # (see connection.resend) and refused: it is lost as soon as it is taken.
                call.refused = answer.reason
        if lead is not None and lead.cut:
            # Its group closed and its interrupted landing names a token the flight
            # no longer has (a retry moved it): nothing to resend. Its joiners hear
            # when this connection closes.
            with lead.lock:
                lead.acked = True
            self._end_lead(lead)
        elif lead is not None:
            self._lose(lead, answer.reason)

    def _on_error(self, answer: wire.ErrorAnswer) -> None:
        log.warning("the coordinator of %s did not understand: %s", self.directory,
                    answer.message)
        if answer.limit is not None:
            self._leases.over_limit(answer.limit)
        call = self._calls.pop(answer.id, None) if answer.id is not None else None
        if call is None:
            return
        if call.lead is not None:
            self._lose(call.lead, answer.message)
        else:
            error = FlightInterruptedError(call.key, f"the coordinator said: {answer.message}")
            _finish(call, Refused(error))

    def _on_lead(self, id: int, token: int) -> None:
        call = self._calls.get(id)
        if call is None:  # withdrawn meanwhile: give the flight back
            self._send(wire.cancel_frame(id))
            return
        log.debug("%s %s: lead, token %d", self.directory, DigestOf(call.key), token)
        lead = call.lead
        if lead is not None:  # a new token for a retry
            self._leases.new_token(lead, token)
            return
        with call.lock:
            fd = call.fd
            if fd == keylocks.OPENING:
                # The caller is still creating the key's file: it takes the lead when
                # its open returns (in its own thread: no hop back to it, no second
                # create racing the first on the directory).
                call.pending = token
                return
            call.fd = -1
        self._key_locks.take(call, fd, token)

    def _lose(self, lead: DirectoryLead, reason: str, *, unreachable: bool = False) -> None:
        """``lead``'s lease is lost (see Leases.lose)."""
        self._leases.lose(lead, reason, unreachable=unreachable)

    def _end_lead(self, lead: DirectoryLead) -> None:
        """Free ``lead``'s key lock once it needs nothing more (see Leases.end)."""
        self._leases.end(lead)

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
    ) -> Call:
        """Ask the directory to lead or join ``key``; events go to the call's inbox.
        ``fresh``: only a flight that begins after the call, or after flight ``after``.
        ``on_detached``: called on the group's thread if a forget() elsewhere detaches
        the flight this call leads or joined.

        The request goes out from this thread when connected. While it travels, this
        thread opens the key's lock file (creating it costs a journal write), so a
        lead finds it open."""
        if self._fatal is not None:
            raise renewed(self._fatal)
        if self._election_error is not None and self._channel is None:
            raise renewed(self._election_error)
        if self._given_up and self._channel is None:
            raise self._out_of_reach()  # no call waits on an outage already seen out
        self.check_key(key)
        self._ensure_started()
        with self._send_lock:
            if self._closing:
                raise GroupClosedError()
            # Again under the lock: the election may have failed since, and its
            # _fail_all (under this lock too) may have run before this call was in.
            if self._fatal is not None:
                raise renewed(self._fatal)
            if self._election_error is not None and self._channel is None:
                raise renewed(self._election_error)
            self._next_id += 1
            call = Call(self._next_id, key, fresh, Inbox(), after, on_detached)
            self._calls[call.id] = call
            channel = self._channel
            if channel is not None:
                send_run(call, channel, self._max_frame)
        if channel is None:
            # Disconnected (maybe refused by another version): try again now; the
            # answer decides this call (ProtocolVersionError while refused).
            self._background.post(self._kick_now)
        taken = keylocks.open_ahead(call, self.directory)
        if taken is not None:  # told to lead while it opened: it takes the lead here
            self._key_locks.take(call, *taken)
        return call

    def _kick_now(self) -> None:
        if self._kick is not None:
            self._kick.set()

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
        if self._calls.pop(call.id, None) is None:
            return
        lead = call.lead
        if lead is not None:
            self._leads.pop(call.id, None)
            with lead.lock:
                lead.abandoned = True
            lead.release()
        else:
            keylocks.drop_fd(call)  # the key's file it opened ahead, in case it led
        # A lead reasserted after a failover is known to the coordinator although its
        # run was never sent on this connection: it is cancelled too.
        if call.sent or lead is not None:
            self._send(wire.cancel_frame(call.id))

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
        if self._closing:
            return
        self._ensure_started()
        end = time.monotonic() + timeout
        while not self._closing and (left := end - time.monotonic()) > 0:
            if not self._connected_now.wait(left):
                break
            waiter: Future[Any] = Future()
            with self._send_lock:
                channel = self._channel
                if channel is None:
                    continue
                self._next_id += 1
                id = self._next_id
                self._waiters[id] = waiter
                channel.send(wire.forget_frame(key, id))
            try:
                waiter.result(max(0.0, end - time.monotonic()))
                return
            except Exception:  # the connection dropped: the next coordinator is told
                continue
        if not self._closing:
            raise UnavailableError(
                f"no coordinator confirmed the forget of {key!r} within {timeout:g} s; "
                "other processes may still join its flight"
            )

    def status(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The flights in progress in the directory (a read-only request). Raises
        UnavailableError when no coordinator answers within ``timeout``, and
        GroupClosedError once the group is closed."""
        if self._closing:
            raise GroupClosedError()
        self._ensure_started()
        waiter: Future[Any] = Future()

        def ask() -> None:
            with self._send_lock:
                self._next_id += 1
                id = self._next_id
            if self._channel is None:
                waiter.set_exception(UnavailableError("no coordinator is connected"))
                return
            self._waiters[id] = waiter
            self._send(wire.status_frame(id))

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
            if self._closing:
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
        if self._closing:
            raise GroupClosedError()
        return [dict(entry) for entry in fs.read_left_threads(self.directory)]

    def close(self) -> None:
        """Wait (at most ``reconnect_timeout``) until every landing made here was
        acknowledged, then disconnect; stop coordinating if this group does. Works
        still running keep their key locks until they end."""
        # (Under the start lock: no call starts the group once it closes. Under the send
        # lock: submit() checks it there.)
        with self._left_lock, self._background.lock, self._send_lock:
            again = self._closing
            self._closing = True
        if not again and self._background.started:
            self._write_left(0, 0)  # a closed group shows nothing
        if again:
            if not self._background.on_its_thread():
                self._close_returned.wait(self._reconnect_timeout + 10)
            return
        try:
            self._close()
        finally:
            self._close_returned.set()

    def _close(self) -> None:
        with self._campaign_lock:  # a won election finishes its epoch write first
            pass
        if self._campaigner is not None:
            park(self._campaigner, self)
        if not self._background.post(self._begin_close):
            return  # never started (or a forked child's copy): nothing runs to close
        with contextlib.suppress(Exception):
            self._closed_future.result(self._reconnect_timeout + 5)
        self._background.stop()

    def _begin_close(self) -> None:
        for call in self._take_unled():
            if call.sent:
                # As a withdrawal does: left out, a coordinator that has not read the
                # run yet would make this dead call a leader, and other processes' calls
                # would join a flight nobody runs until this connection goes.
                self._send(wire.cancel_frame(call.id))
            _finish(call, Refused(GroupClosedError()))
        for lead in list(self._leads.values()):
            if keylocks.abandon(lead):  # still waiting for its key lock: it never starts
                self._leads.pop(lead.call.id, None)
                self._calls.pop(lead.call.id, None)
                _finish(lead.call, Refused(GroupClosedError()))
                lead.landing = wire.land_frame(
                    lead.call.id, lead.token, Interrupted("its leader's group closed")
                )
                self._send(lead.landing)
                continue
            if lead.retrying:  # between attempts: the next one never starts
                lead.retrying = False
                lead.call.inbox.put(LeaseLost("the group closed"))
            if lead.lose(only_running=True):
                # The group closed: its outcome will not be delivered. Its joiners
                # elsewhere are told now (an interrupted landing), not when a later
                # coordinator finds its key lock free; the lock stays held until the
                # work ends (land() frees it then).
                lead.cut = True
                lead.landing = wire.land_frame(
                    lead.call.id, lead.token, Interrupted("its leader's group closed")
                )
                self._send(lead.landing)
        self._close_by = time.monotonic() + self._reconnect_timeout
        self._check_closed()

    def _check_closed(self) -> None:
        """Finish closing once no landing waits for an ack (or time is up)."""
        waiting = [lead for lead in list(self._leads.values()) if lead.landing and not lead.acked]
        if waiting and time.monotonic() < self._close_by and not self._given_up:
            asyncio.get_running_loop().call_later(0.01, self._check_closed)
            return
        if self._finishing:
            return
        self._finishing = True
        for lead in list(self._leads.values()):
            if lead.landing is not None and not lead.acked:
                self._leases.unconfirmed(lead)
            if lead.work_done:
                self._leads.pop(lead.call.id, None)
                lead.release()
            # a running work keeps its key lock until it ends (land() frees it)
        with self._send_lock:
            channel, self._channel = self._channel, None
            self._connected_now.clear()
        for id, waiter in list(self._waiters.items()):  # a forget or status asked meanwhile
            del self._waiters[id]
            if not waiter.done():
                waiter.set_exception(GroupClosedError())
        if channel is not None:
            channel.flush_and_close()
        if self._kick is not None:
            self._kick.set()

        async def finish() -> None:
            if self._maintainer is not None:
                self._maintainer.cancel()
            if self._coordinator is not None:
                await self._coordinator.close()
            self._closed_future.set_result(None)

        asyncio.get_running_loop().create_task(finish())

    def _forked(self, why: str, inherited: BackgroundLoop) -> None:
        """(In a forked child of a started group, see BackgroundLoop) the group's threads
        were not copied: it raises at once here, instead of waiting on a loop that never
        runs (its descriptors were let go, see forked.py)."""
        self._fatal = closed_in_fork(why)
        self._closing = True  # close() has nothing to wait for
        self._close_returned = threading.Event()
        self._close_returned.set()
        self._kick = None
        self._channel = self._coordinator = None
        self._campaigner = None
        if self.on_fork is not None:
            self.on_fork(why)


def _finish(call: Call, event: ScopeEvent) -> None:
    """The call ends without leading: tell its driver."""
    keylocks.drop_fd(call)
    call.inbox.put(event)
