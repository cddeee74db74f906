"""The fleet arbiter: how one group takes part in a Redis namespace (the Scope).

Everything here runs on one background thread per group (:mod:`..scope.loop`), with
its own event loop and its own redis-py clients (:mod:`.clients`): the cross-process
machinery never depends on a caller's loop. A local flight asks once (``submit``); the
answer comes in one round trip from the ACQUIRE script (:mod:`.scripts`): lead, join,
a kept outcome, or (fresh) wait for the running flight's end and ask again.

This module owns a group's calls and leads (:mod:`.calls`), from the Scope methods to
their end: a call begun and ended, a lead taken, withdrawn or given back, the landing's
bookkeeping (the engine settles the flight here only once Redis took it, or fenced it:
then the leader gets LeaseLostError). The steps it runs live beside it: closing and a
forked child's let-go (:mod:`.closing`), ACQUIRE and what its answer starts
(:mod:`.acquire`), a joiner's wait for the outcome (:mod:`.delivery`), a lead's lease
and a retry's new token (:mod:`.renewal`), COMPLETE (:mod:`.landing`), undoing an
unanswered ACQUIRE (:mod:`.undo`), ``status()`` (:mod:`.status`); and the keys
(:mod:`.names`) and an outcome's encoding (:mod:`.outcomes`). The steps take the
arbiter and call its ``_script``, so that one wrapper sees every script a group runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import socket
import threading
import uuid
from collections.abc import Callable, Coroutine, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from redis.connection import parse_url
from redis.exceptions import RedisClusterException, RedisError

from ..errors import GroupClosedError, UnavailableError
from ..scope.events import Lead, LeaseLost, Refused, ScopeEvent
from ..scope.interface import Handed
from ..scope.loop import BackgroundLoop, closed_in_fork
from ..scope.outcome import SharedOutcome
from . import clients, closing, scripts
from .acquire import acquire
from .breaker import Breaker
from .calls import FleetCall, FleetLead
from .clients import MAX_BLOCK, UNREACHABLE
from .landing import complete
from .left import LeftThreads, left_threads
from .names import FORGET_MEMORY_MS, Names, ms, safe_url, server_of
from .readers import LoopClients
from .renewal import Renewal
from .status import running_flights

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from ..engine.flight import Attempt

__all__ = ["RedisArbiter"]


class RedisArbiter:
    """Lead or join for the fleet scope of a group (see the module)."""

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        lease: float = 10.0,
        cluster: bool = False,
        max_value_bytes: int = 1024 * 1024,
    ) -> None:
        try:
            parts = parse_url(url)  # type: ignore[no-untyped-call]  # a bad URL fails here
        except ValueError as exc:
            raise ValueError(f"cannot use the Redis URL {safe_url(url)!r}: {exc}") from None
        self.url = url
        self.server = server_of(parts)
        self.namespace = namespace
        self._lease = lease
        self._lease_ms = ms(lease)
        self._timeout = clients.command_timeout(lease)
        self._cluster = cluster
        self._max_value_bytes = max_value_bytes
        self._pid = os.getpid()
        self._host = socket.gethostname()
        # The group's thread; its lock also orders close() with a start and with what
        # callers post (submit, land, forget, status).
        self._background = BackgroundLoop("fleet", self._forked)
        self._client: Any = None  # Redis | RedisCluster: scripts and commands
        self._blocking: Any = None  # Redis | RedisCluster: the joiners' XREADs
        # A single server's joiners called from an event loop read there (ADR 0056),
        # from the loop's second join (ADR 0058).
        self._readers = LoopClients(
            lambda: self._make_client(MAX_BLOCK + self._timeout, retries=0)
        )
        self._scripts: dict[str, AsyncScript] = {}
        self._ready: asyncio.Task[None] | None = None
        self._calls: set[FleetCall] = set()
        self._leads: set[FleetLead] = set()
        self._renewal = Renewal(self)  # the leads' leases
        # Per key's record: the one task that undoes the ACQUIREs of the key that got
        # no answer, and their nonces (see undo.py).
        self._undoing: dict[str, asyncio.Task[None]] = {}
        self._undo_nonces: dict[str, list[str]] = {}
        self._closing = False
        self._close_returned = threading.Event()  # the first close() is done
        self._closed_why: str | None = None  # set in a forked child (see _forked)
        self._fatal: Exception | None = None  # the clients could not be made
        self._breaker = Breaker(self)  # open while Redis is known out of reach
        # Called in a forked child of a started group (its group drops its flights).
        self.on_fork: Callable[[str], None] | None = None
        self._left = self._left_threads_here()

    # -- starting ---------------------------------------------------------------

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        """The group's loop, started by the first call."""
        return self._background.ensure_started(
            self._setup, check=self._check_open, prepare=self._take_pid
        )

    def _check_open(self) -> None:
        if self._closing:
            raise self._closed()

    def _take_pid(self) -> None:
        # This process leads from now on (a group made before a fork starts in the
        # child: its pid, not the parent's, is the one status() shows).
        self._pid = os.getpid()
        self._left = self._left_threads_here()

    def _left_threads_here(self) -> LeftThreads:
        return LeftThreads(
            self.namespace, host=self._host, pid=self._pid, serial=next(_serials),
            client=lambda: self._client,
        )

    def _setup(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._client = self._make_client(self._timeout, retries=3)
            # Blocking reads: a socket timeout past the longest block, and no silent
            # re-send (each read is also bounded by its own block: see delivery).
            self._blocking = self._make_client(MAX_BLOCK + self._timeout, retries=0)
            self._scripts = {
                name: self._client.register_script(body) for name, body in scripts.SCRIPTS.items()
            }
        except Exception as exc:  # every call reports it (see acquire)
            self._fatal = exc
        else:
            self._ready = loop.create_task(self._startup())

    def _make_client(self, socket_timeout: float, retries: int) -> Any:
        return clients.make_client(
            self.url, cluster=self._cluster, socket_timeout=socket_timeout,
            connect_timeout=self._timeout, retries=retries,
        )

    async def _startup(self) -> None:
        """Load the scripts, warn of an evicting server (best effort: clients.startup)."""
        await clients.startup(
            self._client, self._blocking, cluster=self._cluster, where=self._where()
        )

    def _where(self) -> str:
        return safe_url(self.url)

    def _closed(self) -> GroupClosedError:
        if self._closed_why is None:
            return GroupClosedError()
        return closed_in_fork(self._closed_why)

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            reply = await self._scripts[name](keys=keys, args=args, client=self._client)
        except BaseException as exc:
            self._breaker.saw(exc)
            raise
        self._breaker.answered()
        return reply

    def _unavailable(self, exc: BaseException) -> UnavailableError:
        error = UnavailableError(f"cannot reach Redis at {self._where()}: {exc}")
        error.__cause__ = exc
        return error

    # -- what drivers call (any thread) -----------------------------------------

    @property
    def identity(self) -> Hashable:
        """The server the URL names (however it is spelt) and the namespace."""
        return ("fleet", self.server, self.namespace)

    @property
    def kind(self) -> str:
        return "fleet"

    @property
    def label(self) -> str:
        return f"fleet {self.namespace!r}"

    @property
    def started(self) -> bool:
        """True once the first call started the group's thread."""
        return self._background.started

    @property
    def left_flights_hold_keys(self) -> bool:
        """False: once Redis confirmed a forget, a new flight leads beside the old one
        (whose lease is lost)."""
        return False


    def submit(
        self,
        key: str,
        *,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> FleetCall:
        """Ask the namespace to lead or join ``key``; events go to the call's inbox.
        ``fresh``: only a flight that begins after the call, or after flight ``after``.
        ``on_detached``: called once a FORGET elsewhere parked the flight this call
        joined (its joiners read a notice beside its mailbox) or leads (its next RENEW
        says so). ``loop``: the caller's loop, where a join's outcome is then read
        (a Follow) if that loop joined before (not with a Cluster, whose joiners read
        on the group's loop)."""
        if self._closing:
            raise self._closed()
        refused = self._breaker.refusal()
        if refused is not None:  # Redis is known out of reach: no call waits on it
            raise refused
        group_loop = self._ensure_started()
        call = FleetCall(key, fresh, after, on_detached, None if self._cluster else loop)
        with self._background.lock:  # in order with close(): a call posted here is seen by it
            if self._closing:
                raise self._closed()
            group_loop.call_soon_threadsafe(self._begin, call)
        return call

    def bind(self, call: FleetCall, attempt: Attempt) -> None:
        """The attempt whose work runs under ``call``'s lead (it hears a loss)."""
        lead = call.lead
        assert lead is not None
        lead.bind(attempt)

    def retry(self, call: FleetCall) -> None:
        """Ask a new token for the next attempt; the inbox hears LEAD or LOST."""
        if not self._background.post_task(self._renewal.next_token(call)):
            call.inbox.put(LeaseLost("the group closed"))

    def land(
        self,
        call: FleetCall,
        outcome: SharedOutcome | None,
        *,
        stragglers: list[threading.Event] | None = None,
        done: Callable[[Handed], None] | None = None,
    ) -> None:
        """The flight ended: hand ``outcome`` over (None: nothing to land, the lease
        was lost). ``done`` is told once Redis took the landing, or refused it because
        the flight is no longer this leader's (fenced), or could not be heard for a
        lease (fenced, with the error: it may have taken it). ``stragglers`` are not
        waited for: Redis holds no key lock for them."""
        lead = call.lead
        assert lead is not None
        # In order with close(): a landing made before it is posted before its _close,
        # which waits for it; one made after is not posted, and its lead is not marked
        # done, so _close interrupts it. Every lead is landed or interrupted.
        with self._background.lock:
            posted = not self._closing
            if posted:
                with lead.lock:
                    lead.work_done = True
                posted = self._background.post_task(self._land(lead, outcome, done))
        if not posted and done is not None:
            done(Handed(fenced=True))  # the group closed: nothing can land any more

    def withdraw(self, call: FleetCall) -> None:
        """The flight's driver stopped before the call ended: give it back."""
        self._background.post(self._withdraw, call)

    def check_key(self, key: str) -> None:
        """Any str key fits: Redis keys and stream fields take any bytes."""

    def forget(self, key: str, timeout: float | None = None) -> None:
        """The next call of ``key`` leads a new flight; a kept outcome is dropped, a
        running flight runs on for its joiners (parked under its token)."""
        if self._closing:
            return
        refused = self._breaker.refusal()
        if refused is not None:
            raise refused
        names = Names(self.namespace, key, self._cluster)
        # The nonce makes a FORGET that redis-py re-sends (its reply was lost) answer
        # as the first send did, instead of parking the flight led in the gap.
        nonce = uuid.uuid4().hex
        self._wait(
            self._script(
                "forget", [names.record, names.forgot(nonce), *names.kept], [FORGET_MEMORY_MS]
            ),
            timeout if timeout is not None else 4 * self._timeout + 1,
        )

    def status(self, timeout: float = 10.0, limit: int = 10_000) -> list[dict[str, Any]]:
        """The flights in progress in the namespace (a bounded SCAN, never KEYS)."""
        refused = self._breaker.refusal()
        if refused is not None:
            raise refused
        flights: list[dict[str, Any]] = self._wait(self._status(limit), timeout)
        return flights

    async def _status(self, limit: int) -> list[dict[str, Any]]:
        return await running_flights(self._client, self.namespace, limit)

    def report_left_threads(self, left: int, bound: int) -> None:
        """This group's threads left past a deadline, in a key of its own while there
        are any (see left.py); nothing once the group closed."""
        with self._background.lock:
            if not self._closing:
                self._background.post(self._left.update, left, bound, self._background.spawn)

    def left_threads(self, timeout: float = 10.0, limit: int = 10_000) -> list[dict[str, Any]]:
        """The processes of the namespace whose threads run works past their deadlines
        (a bounded SCAN, never KEYS)."""
        found: list[dict[str, Any]] = self._wait(self._left_threads(limit), timeout)
        return found

    async def _left_threads(self, limit: int) -> list[dict[str, Any]]:
        return await left_threads(self._client, self.namespace, limit)

    def _wait(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        try:
            loop = self._ensure_started()
            # In order with close(), as submit() is: posted before its _close, or not
            # at all (one posted after is dropped with the loop: its caller would wait
            # `timeout` for nothing).
            with self._background.lock:
                if self._closing:
                    raise self._closed()
                future = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop closed meanwhile
            coro.close()
            raise self._closed() from None
        except BaseException:
            coro.close()
            raise
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:  # close() stopped the loop under it
            raise self._closed() from None
        except (RedisError, RedisClusterException) as exc:  # (the latter: no RedisError)
            raise self._unavailable(exc) from exc
        except TimeoutError as exc:
            future.cancel()
            raise self._unavailable(exc) from exc

    # -- on the background loop ----------------------------------------------------

    def _begin(self, call: FleetCall) -> None:
        if self._closing:
            call.inbox.put(Refused(GroupClosedError()))
            return
        self._calls.add(call)
        call.task = self._background.spawn(acquire(self, call), now=True)  # (sent in this turn)
        call.task.add_done_callback(lambda task: self._acquire_ended(call, task))

    def _acquire_ended(self, call: FleetCall, task: asyncio.Task[None]) -> None:
        """An error the steps do not expect (not a RedisError: e.g. a Cluster client's
        RedisClusterException, or a transport's TypeError) ends the call as
        unavailable; it never leaves its caller waiting forever."""
        error = None if task.cancelled() else task.exception()
        if error is not None and call.lead is None and call in self._calls:
            self._end(call, Refused(self._unavailable(error)))

    def _end(self, call: FleetCall, event: ScopeEvent) -> None:
        """The call ends without leading (or its lead is given back)."""
        self._calls.discard(call)
        call.inbox.put(event)

    def _lead(self, call: FleetCall, names: Names, token: int, sent: float) -> None:
        lead = FleetLead(call, token, sent)
        call.lead = lead
        if call.withdrawn or self._closing:
            self._calls.discard(call)
            lead.work_done = True
            self._background.spawn(self._abandon(lead, "its leader withdrew before it started"))
            if self._closing:
                call.inbox.put(Refused(GroupClosedError()))
            return
        self._leads.add(lead)
        self._renewal.start()
        call.inbox.put(Lead(token))

    def _withdraw(self, call: FleetCall) -> None:
        call.withdrawn = True
        self._calls.discard(call)
        lead = call.lead
        if lead is not None:
            self._leads.discard(lead)
            with lead.lock:
                lead.work_done = True
            self._background.spawn(self._abandon(lead, "its leader withdrew"))
        elif call.reading and call.task is not None:
            call.task.cancel()  # a read only; a script in flight finishes and sees withdrawn

    async def _abandon(self, lead: FleetLead, reason: str) -> None:
        """Tell the flight's joiners at once that it will not land (best effort: if
        Redis is out of reach, the lease runs out instead)."""
        self._leads.discard(lead)
        names = Names(self.namespace, lead.call.key, self._cluster)
        token = lead.token
        with contextlib.suppress(*UNREACHABLE):
            await self._script(
                "abandon", [names.record, names.parked(token), names.mailbox(token)],
                [token, self._grace_ms(0.0), reason],
            )

    def _grace_ms(self, keep: float) -> int:
        """How long a mailbox lives: past any joiner's wait and any kept outcome."""
        return ms(max(self._lease, keep) + 1.0)

    async def _land(
        self,
        lead: FleetLead,
        outcome: SharedOutcome | None,
        done: Callable[[Handed], None] | None,
    ) -> None:
        call = lead.call
        self._calls.discard(call)
        if outcome is None:  # lost before it landed: its joiners hear it now
            await self._abandon(lead, "its leader lost its lease")
            if done is not None:
                done(Handed(fenced=True))
            return
        lead.landing = asyncio.current_task()
        handed = Handed(fenced=True)  # until Redis said it landed: done() is told either way
        try:
            handed = await complete(self, lead, outcome)
        finally:
            self._leads.discard(lead)
            if handed.fenced:
                self._renewal.lose(lead, "its landing was fenced or could not be made")
            if done is not None:
                done(handed)

    # -- closing (closing.py) ----------------------------------------------------

    def close(self) -> None:
        """Interrupt the flights led here whose work has not ended (their joiners
        elsewhere hear it at once), end the calls still waiting, wait for landings
        already made, then disconnect. Works still running run on to their end."""
        closing.close(self)

    async def _close(self) -> None:
        """The steps of close() on the group's loop (``closing.close_steps``)."""
        await closing.close_steps(self)

    def _forked(self, why: str, inherited: BackgroundLoop) -> None:
        """(In a forked child of a started group, see BackgroundLoop) no thread of the
        parent was copied: the group lets go of the parent's (``closing.forked``)."""
        closing.forked(self, why, inherited)


_serials = itertools.count(1)  # numbers the groups of this process (keys of left threads)
