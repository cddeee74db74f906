"""The fleet arbiter: how one group takes part in a Redis namespace.

Everything here runs on one background thread per group, with its own event loop
and its own redis-py clients (DESIGN.md: the cross-process machinery never depends
on a caller's loop). A local flight asks once (``submit``); the answer comes in one
round trip from the ACQUIRE script: lead, join, a kept outcome, or (fresh) wait for
the running flight's end and ask again.

- A joiner reads the flight's mailbox (a stream named by its token) from its start
  with a blocking XREAD, on a client of its own whose socket timeout exceeds the
  block and that never re-sends: the outcome is pushed, and no order of "starts
  reading" and "the leader lands" loses it. A read that times out asks CHECK.
- A leader's lease is renewed every lease/3, all flights of the process in one
  RENEW per tick (per slot on a Cluster). RENEW answering 0, or no successful
  renewal for a whole lease, loses it.
- A landing is COMPLETE; the engine settles the flight here only once Redis took it
  (or fenced it: then the leader gets LeaseLostError).

Field ownership: ``FleetCall``/``FleetLead`` fields are written on the background
loop, except ``FleetLead.attempt``/``lost``/``work_done``, guarded by its lock (a
work ends on its own thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Hashable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.connection import parse_url
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from .._log import DigestOf, key_digest, log
from ..errors import GroupClosedError, UnavailableError
from ..scope.events import (
    Inbox,
    Joined,
    Landed,
    Lead,
    LeaseLost,
    NoOutcome,
    Refused,
    ScopeEvent,
)
from ..scope.interface import DetachedNotice, Handed, LeadState, key_as_called
from ..scope.loop import BackgroundLoop, closed_in_fork
from ..scope.outcome import Failure, Interrupted, SharedOutcome, Timeout, Value, kept_size
from . import scripts

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from ..engine.flight import Attempt

__all__ = ["FleetCall", "RedisArbiter"]


_NO_FLIGHT_YET = 2**53  # a fresh call's first ACQUIRE: no flight that exists now is new
_FENCE_TTL_MS = 86_400_000  # the fence key lives a day past its last use
_SLACK = 0.05  # a joiner's clock starts after the reply: wait this much past the lease
_MAX_BLOCK = 30.0  # one XREAD blocks at most this long (then reads again)
# The command client's socket timeout: a quarter of the lease, within these bounds.
# redis-py tries a command 4 times (3 retries), so a server that takes connections but
# does not answer (frozen, SIGSTOP) fails a call in about a lease, not in 4 x 5 s
# whatever the lease (tests/test_fleet_audit.py::test_a_frozen_server_ends_new_calls_and_joiners).
_COMMAND_TIMEOUT = 5.0  # the most (redis-py's default)
_MIN_COMMAND_TIMEOUT = 1.0  # the least: a busy server is not "out of reach"
_FORGET_MEMORY_MS = 60_000  # a FORGET's nonce key: past every re-send of that FORGET
_RETRY_PAUSE = 0.05  # between tries of a step that cannot reach Redis yet
# Connections per client (per node on a Cluster): no limit of the client's own. redis-py
# 6+ bounds an asyncio pool at 100 by default and then raises MaxConnectionsError at once
# (no wait, no retry): the 101st concurrent ACQUIRE failed with UnavailableError, and past
# 100 keys waited on, each read failed and polled CHECK (ADR 0011: each waited key holds
# one blocked connection). The server's maxclients is the bound that matters
# (tests/test_fleet_review.py::test_two_hundred_keys_at_once_all_lead).
_MAX_CONNECTIONS = 2**31
# The longest TTL given to Redis (about 31,700 years). Past PEXPIRE's range, a script
# fails after its HSET (a Lua script has no rollback): a running record, or a mailbox,
# without a TTL, which every later caller of the key would join for ever.
_MAX_TTL_MS = 10**15
_ANSWERS = {1: "lead", 2: "join", 3: "kept", 4: "wait for the next flight"}
# What a step treats as "Redis is out of reach now": it tries again until its own
# limit. (A Cluster client's errors are not RedisErrors.)
_UNREACHABLE = (RedisError, RedisClusterException, OSError)


class FleetCall(DetachedNotice):
    """One local flight's request to the namespace (``on_detached``: a FORGET elsewhere
    parked the flight it leads or joined)."""

    __slots__ = (
        "after", "fresh", "inbox", "key", "lead", "nonce", "reading", "task", "withdrawn"
    )

    def __init__(
        self,
        key: str,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(on_detached)
        self.key = key
        self.fresh = fresh
        self.after = after
        self.inbox = Inbox()
        self.nonce = uuid.uuid4().hex  # makes a re-sent ACQUIRE find its own flight
        self.lead: FleetLead | None = None
        self.task: asyncio.Task[None] | None = None
        self.reading = False  # only a read may be cancelled: a script may have run
        self.withdrawn = False


class FleetLead(LeadState):
    """A flight this process leads: its token, its lease, its landing."""

    __slots__ = ("call", "landing", "moves", "renewed_at", "token")

    def __init__(self, call: FleetCall, token: int, renewed_at: float) -> None:
        super().__init__()
        self.call = call
        self.token = token
        # ATTEMPTs sent plus ATTEMPTs heard: odd while one is in flight. A renewal that
        # crossed one answers for a token Redis may have moved on from: it must not count.
        self.moves = 0
        # When the last renewal that Redis took was sent: the record lives a lease past it.
        self.renewed_at = renewed_at
        self.landing: asyncio.Task[None] | None = None


class _Names:
    """The Redis key names of one flightgroup key."""

    __slots__ = ("fence", "kept", "record")

    def __init__(self, namespace: str, key: str, cluster: bool) -> None:
        digest = hashlib.sha256(key.encode(errors="surrogatepass")).hexdigest()
        self.record = f"fg:{{{namespace}:{digest}}}"
        self.fence = f"{self.record}:f" if cluster else f"fg:{{{namespace}}}:fence"
        # The namespace's index of kept outcomes (Retention's LRU bounds), which the
        # scripts that keep, serve or drop an outcome update in the same step. None on
        # a Cluster: it lives in another slot than the records, so only TTLs bound
        # kept outcomes there (ADR 0021).
        index = f"fg:{{{namespace}}}:kept"
        self.kept = [] if cluster else [index, f"{index}:x", f"{index}:b"]

    def parked(self, token: int) -> str:
        return f"{self.record}:x:{token}"

    def mailbox(self, token: int) -> str:
        return f"{self.record}:m:{token}"

    def notice(self, token: int) -> str:
        return f"{self.record}:n:{token}"

    def forgot(self, nonce: str) -> str:
        return f"{self.record}:g:{nonce}"


def _fields(flat: Sequence[Any]) -> dict[bytes, bytes]:
    """A stream entry's or a hash's flat [name, value, ...] reply as a dict."""
    return {flat[i]: flat[i + 1] for i in range(0, len(flat) - 1, 2)}


def _key_text(raw: bytes) -> str:
    """A key as the group was called with it: keys are written with surrogatepass (a
    command line's undecodable bytes), so read back the same way."""
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # not written by a group
        return raw.decode("utf-8", "replace")


def _entries(reply: Any) -> dict[str, dict[bytes, bytes]]:
    """Stream name -> the fields of its one entry, from an XREAD reply in either
    protocol's shape: RESP2 ``[[stream, [(id, fields)]], ...]``; RESP3 (a URL with
    ``?protocol=3``) a dict ``{stream: ...}`` whose entries redis-py wraps once more (8.x)."""
    streams = reply.items() if isinstance(reply, dict) else [(s, e) for s, e in reply]
    found: dict[str, dict[bytes, bytes]] = {}
    for stream, node in streams:
        while not (isinstance(node, (list, tuple)) and len(node) == 2
                   and isinstance(node[0], (bytes, str))):
            node = node[0]  # down to the entry, (id, fields)
        fields = node[1]
        name = stream.decode() if isinstance(stream, bytes) else stream
        found[name] = fields if isinstance(fields, dict) else _fields(fields)
    return found


def encode_outcome(outcome: SharedOutcome) -> tuple[str, bytes, float]:
    """(code, payload, seconds to keep) of an outcome, as the mailbox holds it."""
    if isinstance(outcome, Value):
        return "ok", outcome.data, outcome.keep or 0.0
    if isinstance(outcome, Failure):
        body = {"type": outcome.type, "module": outcome.module, "message": outcome.message}
        return "err", json.dumps(body).encode(), outcome.keep or 0.0
    if isinstance(outcome, Timeout):
        return "tmo", repr(outcome.deadline).encode(), 0.0
    return "int", outcome.reason.encode(), 0.0


def kept_bounds(outcome: SharedOutcome) -> tuple[int, int, int]:
    """(size, max_items, max_bytes) of an outcome for the kept index (0: no bound).
    Size: a value's encoded bytes; a failure's, the UTF-8 bytes of its type, module
    and message (as the directory scope counts them)."""
    if not isinstance(outcome, (Value, Failure)):
        return 0, 0, 0
    return kept_size(outcome), outcome.max_items or 0, outcome.max_bytes or 0


def decode_outcome(code: bytes | None, payload: bytes | None) -> SharedOutcome:
    """The outcome of a mailbox entry (or a kept record); anything unreadable is an
    interruption, never a wrong value."""
    payload = payload if payload is not None else b""
    try:
        if code == b"ok":
            return Value(payload)
        if code == b"err":
            body = json.loads(payload)
            return Failure(str(body["type"]), str(body["module"]), str(body["message"]))
        if code == b"tmo":
            return Timeout(float(payload))
        if code == b"int":
            return Interrupted(payload.decode(errors="replace") or "its leader stopped")
    except (KeyError, TypeError, ValueError):
        pass
    return Interrupted("its outcome in Redis could not be read")


# Names of this host's loopback interface that a Redis URL commonly uses for one server.
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def _server_of(parts: dict[str, Any]) -> tuple[Hashable, ...]:
    """The server and database that a parsed Redis URL names, without network I/O: its
    socket's real path, or its host (one name for the loopback ones: ``localhost``, ``127.0.0.1``
    and ``::1``; others as written, lowercased) and port, and the database. Groups of
    this process whose URLs name one server are one scope to I6 (ADR 0006)."""
    db = int(parts.get("db") or 0)
    if "path" in parts:
        return ("unix", os.path.realpath(str(parts["path"])), db)
    host = str(parts.get("host") or "localhost").lower()
    return ("tcp", "loopback" if host in _LOOPBACK else host, int(parts.get("port") or 6379), db)


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
            raise ValueError(f"cannot use the Redis URL {_safe(url)!r}: {exc}") from None
        self.url = url
        self.server = _server_of(parts)
        self.namespace = namespace
        self._lease = lease
        self._lease_ms = _ms(lease)
        self._timeout = min(_COMMAND_TIMEOUT, max(_MIN_COMMAND_TIMEOUT, lease / 4))
        self._cluster = cluster
        self._max_value_bytes = max_value_bytes
        self._pid = os.getpid()
        self._host = socket.gethostname()
        # The group's thread; its lock also orders close() with a start and with what
        # callers post (submit, land, forget, status).
        self._background = BackgroundLoop("fleet", self._forked)
        self._client: Any = None  # Redis | RedisCluster: scripts and commands
        self._blocking: Any = None  # Redis | RedisCluster: the joiners' XREADs
        self._scripts: dict[str, AsyncScript] = {}
        self._ready: asyncio.Task[None] | None = None
        self._calls: set[FleetCall] = set()
        self._leads: set[FleetLead] = set()
        self._renewer: asyncio.Task[None] | None = None
        # Per key's record: the one task that undoes the ACQUIREs of the key that got
        # no answer, and their nonces (see _undo).
        self._undoing: dict[str, asyncio.Task[None]] = {}
        self._undo_nonces: dict[str, list[str]] = {}
        self._closing = False
        self._close_returned = threading.Event()  # the first close() is done
        self._closed_why: str | None = None  # set in a forked child (see _forked)
        self._fatal: Exception | None = None  # the clients could not be made
        # Called in a forked child of a started group (its group drops its flights).
        self.on_fork: Callable[[str], None] | None = None

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

    def _setup(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._client = self._make_client(self._timeout, retries=3)
            # Blocking reads: a socket timeout past the longest block, and no silent
            # re-send (each read is also bounded by its own block: see _read_outcome).
            self._blocking = self._make_client(_MAX_BLOCK + self._timeout, retries=0)
            self._scripts = {
                name: self._client.register_script(body) for name, body in scripts.SCRIPTS.items()
            }
        except Exception as exc:  # every call reports it (see _acquire)
            self._fatal = exc
        else:
            self._ready = loop.create_task(self._startup())

    def _make_client(self, socket_timeout: float, retries: int) -> Any:
        retry = (
            Retry(ExponentialWithJitterBackoff(base=0.02, cap=0.5), retries)
            if retries
            else Retry(NoBackoff(), 0)
        )
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": self._timeout,
            "retry": retry,
            "max_connections": _MAX_CONNECTIONS,
        }
        if self._cluster:
            return RedisCluster.from_url(self.url, **options)
        return aioredis.Redis.from_url(self.url, **options)

    async def _startup(self) -> None:
        """Load the scripts (a call then needs no NOSCRIPT round trips) and warn when
        the server may evict the library's keys. Best effort: a call reports its own
        errors."""
        client = self._client
        try:
            if self._cluster:
                # Discover the nodes now: the first commands of a Cluster client that
                # run at once race its discovery, which closes connections under them
                # (redis-py 8.1: a TypeError from the transport, not a RedisError).
                await client.initialize()
                await self._blocking.initialize()
            else:
                async with client.pipeline(transaction=False) as pipe:
                    for body in scripts.SCRIPTS.values():
                        pipe.script_load(body)
                    await pipe.execute()
            policy = await client.config_get("maxmemory-policy")
        except (RedisError, RedisClusterException):
            return
        value = policy.get(b"maxmemory-policy") or policy.get("maxmemory-policy")
        if isinstance(value, bytes):
            value = value.decode()
        if value and value != "noeviction":
            log.warning(
                "Redis at %s has maxmemory-policy %s: it may evict flightgroup's keys "
                "(an evicted flight acts like a lost lease); use noeviction or a "
                "database of its own", self._where(), value,
            )

    def _where(self) -> str:
        return _safe(self.url)

    def _closed(self) -> GroupClosedError:
        if self._closed_why is None:
            return GroupClosedError()
        return closed_in_fork(self._closed_why)

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await self._scripts[name](keys=keys, args=args, client=self._client)

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
    ) -> FleetCall:
        """Ask the namespace to lead or join ``key``; events go to the call's inbox.
        ``fresh``: only a flight that begins after the call, or after flight ``after``.
        ``on_detached``: called on the group's thread once a FORGET elsewhere parked the
        flight this call joined (its joiners read a notice beside its mailbox) or leads
        (its next RENEW says so)."""
        if self._closing:
            raise self._closed()
        loop = self._ensure_started()
        call = FleetCall(key, fresh, after, on_detached)
        with self._background.lock:  # in order with close(): a call posted here is seen by it
            if self._closing:
                raise self._closed()
            loop.call_soon_threadsafe(self._begin, call)
        return call

    def bind(self, call: FleetCall, attempt: Attempt) -> None:
        """The attempt whose work runs under ``call``'s lead (it hears a loss)."""
        lead = call.lead
        assert lead is not None
        lead.bind(attempt)

    def retry(self, call: FleetCall) -> None:
        """Ask a new token for the next attempt; the inbox hears LEAD or LOST."""
        if not self._background.post_task(self._attempt(call)):
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
        # which waits for it; one made after is not posted, and the work left running
        # is interrupted by _close (marked done first, it was neither landed nor
        # interrupted: its joiners waited out the lease).
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
        names = _Names(self.namespace, key, self._cluster)
        # The nonce makes a FORGET that redis-py re-sends (its reply was lost) answer
        # as the first send did, instead of parking the flight led in the gap.
        nonce = uuid.uuid4().hex
        self._wait(
            self._script(
                "forget", [names.record, names.forgot(nonce), *names.kept], [_FORGET_MEMORY_MS]
            ),
            timeout if timeout is not None else 4 * self._timeout + 1,
        )

    def status(self, timeout: float = 10.0, limit: int = 10_000) -> list[dict[str, Any]]:
        """The flights in progress in the namespace (a bounded SCAN, never KEYS)."""
        flights: list[dict[str, Any]] = self._wait(self._status(limit), timeout)
        return flights

    def _wait(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        try:
            loop = self._ensure_started()
            # In order with close(), as submit() is: posted before its _close, or not
            # at all (posted after, it was dropped with the loop: a wait of `timeout`).
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
        call.task = asyncio.get_running_loop().create_task(self._acquire(call))
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

    async def _acquire(self, call: FleetCall) -> None:
        if self._fatal is not None:
            self._end(call, Refused(self._unavailable(self._fatal)))
            return
        if self._cluster and self._ready is not None and not self._ready.done():
            # A Cluster client's first commands race its discovery (see _startup): wait
            # for it, at most a command timeout. A single server's scripts need no
            # wait (a missing one costs a NOSCRIPT round trip): a frozen server fails
            # the first call in 4 command timeouts, as any other, not in 8.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._ready), self._timeout)
        names = _Names(self.namespace, call.key, self._cluster)
        undo = self._undoing.get(names.record)
        if undo is not None and not undo.done():
            # A flight an unanswered ACQUIRE of the key may have led: this call would
            # join it and wait its lease out. Redis out of reach: the ACQUIRE says so.
            await asyncio.wait({undo}, timeout=self._timeout)
        # A fresh call takes a flight from min_token on: one newer than the flight its
        # callers waited for here, else one newer than every flight there is now.
        min_token, after = 0, None
        if call.fresh:
            after = call.after  # (if Redis knows it forgotten, none that exists will do)
            min_token = _NO_FLIGHT_YET if after is None else after + 1
        while True:
            sent = time.monotonic()
            args = [call.nonce, self._lease_ms, _FENCE_TTL_MS, min_token, self._pid,
                    self._host, call.key.encode("utf-8", "surrogatepass")]
            if after is not None:
                args.append(after)
            try:
                reply = await self._script(
                    "acquire", [names.record, names.fence, *names.kept], args
                )
            except _UNREACHABLE as exc:
                self._end(call, Refused(self._unavailable(exc)))
                self._undo_later(call.key, names, call.nonce)
                return
            kind, token = int(reply[0]), int(reply[1])
            log.debug("%s %s: %s, token %d", self.namespace, DigestOf(call.key),
                      _ANSWERS.get(kind, "?"), token)
            if kind == 1:
                self._lead(call, names, token, sent)
                return
            if call.withdrawn:
                self._calls.discard(call)
                return
            if kind == 3:
                self._end(call, Landed(token, decode_outcome(reply[2], reply[3]), True))
                return
            if kind == 2:
                age = int(reply[5]) / 1e6
                call.inbox.put(Joined(token, int(reply[3]), age, reply[4].decode()))
                ended = await self._read_outcome(call, names, token, int(reply[2]), follow=True)
                self._end(call, ended)
                return
            # kind 4 (fresh): the flight that runs began before this call; after its
            # end, the first flight from the next token on is this call's.
            ended = await self._read_outcome(call, names, token, int(reply[2]), follow=False)
            if call.withdrawn:
                self._calls.discard(call)
                return
            if isinstance(ended, Landed):
                # It ended under the token of its last retry: ask from past that one, or
                # its kept outcome (past the first token) was taken as a newer flight's
                # (tests/test_fleet_review.py::
                # test_a_fresh_caller_never_takes_the_kept_outcome_of_a_flight_that_retried).
                token = max(token, ended.token)
            min_token, after = token + 1, None  # the flight it waited for ended after it

    async def _read_outcome(
        self, call: FleetCall, names: _Names, token: int, pttl: int, *, follow: bool
    ) -> Landed | NoOutcome | Refused:
        """Wait for flight ``token``'s outcome: the event that ends the call.
        ``follow``: a retry's new token is told to the call (Joined) and followed."""
        deadline = time.monotonic() + max(pttl, 0) / 1000 + _SLACK
        unreachable: BaseException | None = None
        while True:
            if call.withdrawn:
                # Withdrawn while a CHECK ran (only a read is cancelled): stop here, or
                # the read went on, holding its connection, to the flight's end, and
                # close() waited for it.
                return NoOutcome("withdrawn")
            fields: dict[bytes, bytes] | None = None
            left = deadline - time.monotonic()
            if left > 0:
                call.reading = True
                block = min(left, _MAX_BLOCK)
                mailbox = names.mailbox(token)
                streams = {mailbox: b"0"}
                # A joiner also reads the flight's notice (a FORGET parked it), until heard.
                notice = names.notice(token) if follow and call.on_detached else None
                if notice is not None:
                    streams[notice] = b"0"
                try:
                    # Bounded by its own block (plus a command's time), not by the
                    # client's socket timeout past the longest block: a frozen server
                    # held a joiner 35 s whatever the lease. A read cut short is
                    # disconnected by redis-py, never reused with its reply pending.
                    reply = await asyncio.wait_for(
                        self._blocking.xread(
                            streams, count=1, block=max(1, round(block * 1000))
                        ),
                        block + self._timeout,
                    )
                    unreachable = None
                except _UNREACHABLE as exc:
                    unreachable, reply = exc, None
                    await asyncio.sleep(_RETRY_PAUSE)
                finally:
                    call.reading = False
                if reply:
                    entries = _entries(reply)
                    if notice is not None and notice in entries:
                        call.detached()
                    fields = entries.get(mailbox)
                    if fields is None:
                        continue  # only the notice: read the mailbox again
                elif unreachable is None and time.monotonic() < deadline:
                    continue  # a capped block ended: read again
            if fields is None:
                try:
                    checked = await self._script(
                        "check", [names.record, names.parked(token), names.mailbox(token)],
                        [token],
                    )
                except _UNREACHABLE as exc:
                    if time.monotonic() > deadline + self._lease:
                        return Refused(self._unavailable(exc))
                    await asyncio.sleep(_RETRY_PAUSE)
                    continue
                if int(checked[0]) == 0:
                    if unreachable is not None:
                        reason = "Redis lost its flight while it was unreachable"
                    else:
                        reason = "its leader stopped renewing its lease"
                    return NoOutcome(reason)
                if int(checked[0]) == 2:
                    deadline = time.monotonic() + max(int(checked[1]), 0) / 1000 + _SLACK
                    continue
                fields = _fields(checked[1])
            code = fields.get(b"c")
            if code == b"next":  # a retry: the flight goes on under a new token
                token = int(fields.get(b"v", b"0"))
                if follow:
                    call.inbox.put(Joined(token, 0, 0.0, ""))
                # Ask CHECK first: the flight's own lease left (the leader's, not ours).
                deadline = time.monotonic()
                continue
            return Landed(token, decode_outcome(code, fields.get(b"v")), False)

    def _lead(self, call: FleetCall, names: _Names, token: int, sent: float) -> None:
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
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew())
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

    def _undo_later(self, key: str, names: _Names, nonce: str) -> None:
        record = names.record
        self._undo_nonces.setdefault(record, []).append(nonce)
        running = self._undoing.get(record)
        if running is not None and not running.done():
            return  # it undoes this nonce too: one task per key, however many calls failed
        task = self._undoing[record] = self._background.spawn(self._undo(key, names))

        def ended(task: asyncio.Task[None]) -> None:
            if self._undoing.get(record) is task:
                del self._undoing[record]
                self._undo_nonces.pop(record, None)

        task.add_done_callback(ended)

    async def _undo(self, key: str, names: _Names) -> None:
        """End the flight an ACQUIRE of the key that got no answer may have led
        (scripts.UNDO), for each such ACQUIRE's nonce: a frozen server runs what it had
        buffered once it resumes. Tried until Redis answers, then once more: Redis reads
        every connection that was waiting in its first pass after it resumes, and the
        second try is sent after the first one's answer, so after each buffered ACQUIRE
        of ours has run (ADR 0024). Nonces of calls that fail meanwhile join in."""
        nonces = self._undo_nonces.setdefault(names.record, [])
        answered: dict[str, int] = {}
        grace, reason = self._grace_ms(0.0), "its leading call got no answer from Redis"
        pause = _RETRY_PAUSE
        while pending := [n for n in nonces if answered.get(n, 0) < 2]:
            try:
                for nonce in pending:
                    if await self._script("undo", [names.record], [nonce, grace, reason]):
                        log.info("ended a flight of %s that a call led with no answer "
                                 "from Redis", key_digest(key))
                    answered[nonce] = answered.get(nonce, 0) + 1
            except _UNREACHABLE:
                if self._closing:
                    return
                await asyncio.sleep(pause)
                pause = min(2 * pause, 1.0)

    async def _abandon(self, lead: FleetLead, reason: str) -> None:
        """Tell the flight's joiners at once that it will not land (best effort: if
        Redis is out of reach, the lease runs out instead)."""
        self._leads.discard(lead)
        names = _Names(self.namespace, lead.call.key, self._cluster)
        token = lead.token
        with contextlib.suppress(*_UNREACHABLE):
            await self._script(
                "abandon", [names.record, names.parked(token), names.mailbox(token)],
                [token, self._grace_ms(0.0), reason],
            )

    def _grace_ms(self, keep: float) -> int:
        """How long a mailbox lives: past any joiner's wait and any kept outcome."""
        return _ms(max(self._lease, keep) + 1.0)

    def _lose(self, lead: FleetLead, reason: str, gone: bool = False) -> None:
        """``gone``: Redis said it no longer holds the flight (a reply, not silence)."""
        if lead.lose():
            log.info("lost the lease of a flight of %s (token %d): %s",
                     key_digest(lead.call.key), lead.token, reason)
            if gone:
                # It leaves the local table as a forget() would take it, so a new call
                # of the key here asks Redis instead of joining a flight that can only
                # end interrupted; its callers stay with it. Only then: while Redis may
                # still hold it, a call asking Redis would join it, and a run_sync on
                # its work's loop would block that loop (the table refuses that one
                # for a flight still in it).
                lead.call.detached()

    async def _renew(self) -> None:
        """Renew every lease of this process each lease/3, in one call (per slot)."""
        while self._leads:
            await asyncio.sleep(self._lease / 3)
            # A renewal that hangs (a frozen server) must not keep a lease alive here
            # while it runs out in Redis: no renewal taken for a whole lease loses it.
            now = time.monotonic()
            for lead in list(self._leads):
                if not lead.lost and now - lead.renewed_at > self._lease:
                    self._lose(lead, "no renewal reached Redis for a whole lease")
            # A flight younger than lease/3 needs no renewal yet (at the next tick it
            # is younger than 2/3 of its lease): a short flight costs two round trips.
            due = now - self._lease / 3
            # (A lead whose retry's ATTEMPT is in flight is renewed by that ATTEMPT.)
            leads = [
                lead for lead in self._leads
                if not lead.lost and lead.renewed_at <= due and not lead.moves % 2
            ]
            groups: dict[int, list[tuple[FleetLead, int, int]]] = {}
            for lead in leads:
                names = _Names(self.namespace, lead.call.key, self._cluster)
                slot = key_slot(names.record.encode()) if self._cluster else 0
                groups.setdefault(slot, []).append((lead, lead.token, lead.moves))
            ended = await asyncio.gather(
                *(self._renew_some(batch) for batch in groups.values()), return_exceptions=True
            )
            for error in ended:  # unexpected: the whole-lease check above still applies
                if isinstance(error, Exception):
                    log.warning("a lease renewal in %s failed: %r", self.namespace, error)

    async def _renew_some(self, batch: list[tuple[FleetLead, int, int]]) -> None:
        keys: list[str] = []
        args: list[Any] = [self._lease_ms]
        for lead, token, _ in batch:
            names = _Names(self.namespace, lead.call.key, self._cluster)
            keys += [names.record, names.parked(token)]
            args.append(token)
        sent = time.monotonic()
        try:
            # Bounded: the client's own timeouts and retries of a server that does not
            # answer take 4 command timeouts (4 x 5 s before they followed the lease),
            # past lease/3 (found by
            # tests/test_fleet_protocol.py::test_a_frozen_server_loses_the_leaders_lease).
            renewed = await asyncio.wait_for(self._script("renew", keys, args), self._lease / 3)
        except (*_UNREACHABLE, TimeoutError) as exc:
            now = time.monotonic()
            for lead, _, _ in batch:
                if now - lead.renewed_at > self._lease:
                    self._lose(lead, f"Redis was out of reach for a whole lease ({exc})")
            return
        for (lead, token, moves), ok in zip(batch, renewed, strict=True):
            # A retry's ATTEMPT sent meanwhile may have run first in Redis (RENEW then
            # answers 0 for the old token) and be heard after this reply: only its own
            # reply counts. (Comparing tokens alone lost the lease of a healthy flight:
            # tests/test_fleet_review.py::
            # test_a_renewal_sent_while_a_retry_moves_the_flight_does_not_lose_its_lease.)
            if lead.token != token or lead.moves != moves:
                continue
            if int(ok):
                lead.renewed_at = max(lead.renewed_at, sent)
                if int(ok) == 2:  # a FORGET parked it
                    lead.call.detached()
            else:
                self._lose(lead, "Redis no longer holds its flight", gone=True)

    async def _attempt(self, call: FleetCall) -> None:
        try:
            await self._new_attempt(call)
        except Exception as exc:  # unexpected: the retry must not wait forever
            if call.lead is not None:
                self._lose(call.lead, f"a retry's new token could not be had: {exc!r}")
            call.inbox.put(LeaseLost("lost"))

    async def _new_attempt(self, call: FleetCall) -> None:
        lead = call.lead
        assert lead is not None
        if lead.lost or self._closing:
            call.inbox.put(LeaseLost("the group closed" if self._closing else "lost"))
            return
        names = _Names(self.namespace, call.key, self._cluster)
        old = lead.token
        lead.moves += 1  # odd: an ATTEMPT is in flight (see FleetLead.moves)
        try:
            while True:
                sent = time.monotonic()
                try:
                    reply = await self._script(
                        "attempt",
                        [names.record, names.parked(old), names.fence, names.mailbox(old)],
                        [old, call.nonce, self._lease_ms, _FENCE_TTL_MS, self._grace_ms(0.0)],
                    )
                except _UNREACHABLE as exc:
                    if time.monotonic() - lead.renewed_at > self._lease:
                        self._lose(lead, f"Redis was out of reach for a whole lease ({exc})")
                        call.inbox.put(LeaseLost("Redis was out of reach"))
                        return
                    await asyncio.sleep(_RETRY_PAUSE)
                    continue
                break
            if int(reply[0]) == 0:
                self._lose(lead, "Redis no longer holds its flight", gone=True)
                call.inbox.put(LeaseLost("lost"))
                return
            lead.token, lead.renewed_at = int(reply[1]), sent
        finally:
            lead.moves += 1
        if call.withdrawn or self._closing or lead.work_done:
            # The flight ended here (withdrawn, closed, or landed under the old token)
            # while Redis moved it to this token: nobody else gives it back, and its
            # joiners, following `next`, waited a whole lease (tests/test_fleet_review.py::
            # test_closing_during_a_retrys_attempt_interrupts_the_joiners_elsewhere_at_once).
            self._leads.discard(lead)
            await self._abandon(lead, "its leader stopped during a retry")
            call.inbox.put(LeaseLost("the group closed" if self._closing else "withdrawn"))
            return
        call.inbox.put(Lead(lead.token))

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
        names = _Names(self.namespace, call.key, self._cluster)
        token = lead.token
        code, payload, keep = encode_outcome(outcome)
        size, max_items, max_bytes = kept_bounds(outcome)
        fenced = True  # until Redis said it landed: whatever ends this, done() is told
        unconfirmed: UnavailableError | None = None
        refusals = 0  # passing server errors heard (the first one is logged)
        began = time.monotonic()
        try:
            while True:
                try:
                    reply = await self._script(
                        "complete",
                        [names.record, names.parked(token), names.mailbox(token), *names.kept],
                        [token, code, payload, round(min(float(_MAX_TTL_MS), keep * 1000)),
                         self._grace_ms(keep), self._max_value_bytes,
                         size, max_items, max_bytes],
                    )
                except _UNREACHABLE as exc:
                    if _refused_as_too_large(exc):  # COMPLETE's own refusal: final
                        log.warning("Redis refused a landing of %s: %s", key_digest(call.key), exc)
                        await self._abandon(lead, "Redis refused its leader's landing")
                        break
                    # Out of reach, or a passing server error (OOM under noeviction,
                    # BUSY, READONLY in a failover, LOADING): the lease still runs, so
                    # try again within it. (Every ResponseError was taken as final: a
                    # leader whose lease was never lost got LeaseLostError and its
                    # joiners waited the lease out, tests/test_fleet_review3.py::
                    # test_a_landing_refused_by_a_server_out_of_memory_for_a_moment_is_made_again.)
                    # Bounded by a lease from the landing's start too: RENEW goes on
                    # meanwhile, and may be taken (PEXPIRE is no write OOM refuses)
                    # while COMPLETE is refused for good: the leader and its joiners
                    # waited for ever.
                    if time.monotonic() - min(lead.renewed_at, began) > self._lease:
                        self._lose(lead, f"Redis did not take its landing for a lease ({exc})")
                        if isinstance(exc, ResponseError):  # it answers: tell the joiners
                            await self._abandon(lead, "Redis refused its leader's landing")
                        else:
                            # Unheard, not refused: Redis may have run a COMPLETE whose
                            # reply was lost, and its joiners have the outcome. The
                            # leader cannot tell, so it does not say the lease was lost.
                            unconfirmed = UnavailableError(
                                f"Redis at {self._where()} did not confirm the landing "
                                f"for a lease, so its joiners may have its outcome: {exc!r}"
                            )
                            unconfirmed.__cause__ = exc  # (the work's error, if any, then)
                        break
                    if isinstance(exc, ResponseError) and not refusals:
                        log.info("Redis refused a landing of %s for now, trying again: %s",
                                 key_digest(call.key), exc)
                    refusals += isinstance(exc, ResponseError)
                    await asyncio.sleep(_RETRY_PAUSE)
                    continue
                fenced = int(reply[0]) == 0
                log.debug("%s %s: %s, token %d", self.namespace, DigestOf(call.key),
                          "fenced" if fenced else "landed", token)
                break
        finally:
            self._leads.discard(lead)
            if fenced:
                self._lose(lead, "its landing was fenced or could not be made")
            if done is not None:
                done(Handed(fenced=fenced, unconfirmed=unconfirmed))

    async def _status(self, limit: int) -> list[dict[str, Any]]:
        client = self._client
        prefix = f"fg:{{{self.namespace}:"
        pattern = f"{_glob_escape(prefix)}*"
        # The glob also matches a longer namespace ("app" finds "app:v2"): only a
        # record or a parked record of this one (the key's digest, then the tag's end).
        ours = re.compile(re.escape(prefix.encode()) + rb"[0-9a-f]{64}\}(?::x:[0-9]+)?\Z")
        names: list[bytes] = []
        async for name in client.scan_iter(match=pattern, count=1000):
            if ours.match(name):
                names.append(name)
                if len(names) >= limit:
                    break
        if not names:
            return []
        now = await client.time()
        now_us = now[0] * 1_000_000 + now[1]
        records = await asyncio.gather(
            *(client.hmget(name, "k", "t", "s", "p", "h", "b", "j") for name in names)
        )
        flights = []
        for record in records:
            key, token, state, pid, host, began, joiners = record
            if state != b"R" or token is None:
                continue
            flights.append({
                "key": key_as_called(_key_text(key or b"")),
                "token": int(token),
                "leader_pid": int(pid or 0),
                "host": (host or b"").decode(errors="replace"),
                "joiners": int(joiners or 0),
                "age_s": round(max(0, now_us - int(began or now_us)) / 1e6, 3),
            })
        flights.sort(key=lambda flight: flight["token"])
        return flights

    # -- closing ----------------------------------------------------------------

    def close(self) -> None:
        """Interrupt the flights led here whose work has not ended (their joiners
        elsewhere hear it at once), end the calls still waiting, wait for landings
        already made, then disconnect. Works still running run on to their end."""
        bound = min(threading.TIMEOUT_MAX, 2 * _COMMAND_TIMEOUT + self._lease)
        with self._background.lock:
            again = self._closing
            self._closing = True
        if again:
            # A second close() returns when the first did: the landings are handed over.
            if not self._background.on_its_thread():
                self._close_returned.wait(min(threading.TIMEOUT_MAX, bound + 10))
            return
        try:
            self._close_now(bound)
        finally:
            self._close_returned.set()

    def _close_now(self, bound: float) -> None:
        loop = self._background.loop
        if loop is None:
            return
        future: Future[None] = asyncio.run_coroutine_threadsafe(self._close(), loop)
        with contextlib.suppress(Exception):
            # (A lease past threading.TIMEOUT_MAX made result() raise at once.)
            future.result(bound)
        self._background.stop()

    async def _close(self) -> None:
        # Steps already sent (an ACQUIRE, a retry's ATTEMPT) may still win a lead; each
        # gives it back itself once it hears (the call is withdrawn, the group closing).
        # Wait for them and for what they spawn, or the loop stopped under them and the
        # lead stayed for its joiners to wait a lease out (tests/test_fleet_review.py::
        # test_closing_during_an_acquire_that_leads_gives_the_lead_back).
        pending = {call.task for call in self._calls if call.task is not None}
        for call in list(self._calls):
            if call.lead is None:
                self._calls.discard(call)
                if call.reading and call.task is not None:
                    call.task.cancel()
                call.withdrawn = True
                call.inbox.put(Refused(GroupClosedError()))
        for lead in list(self._leads):
            if lead.landing is None and lead.lose(only_running=True):
                self._background.spawn(self._abandon(lead, "its leader's group closed"))
        pending |= self._background.tasks
        while pending := {task for task in pending if not task.done()}:
            await asyncio.wait(pending)
            pending = set(self._background.tasks)
        if self._renewer is not None:
            self._renewer.cancel()
        for client in (self._client, self._blocking):
            with contextlib.suppress(Exception):
                await client.aclose()

    def _forked(self, why: str, inherited: BackgroundLoop) -> None:
        """(In a forked child of a started group, see BackgroundLoop) no thread of the
        parent was copied: the group raises at once here, its copies of the parent's
        loop and connections are kept from acting (see ``_let_go``), and its group drops
        the flights copied from the parent's table (ADR 0018)."""
        _inherited.append(dict(vars(self), _background=inherited))
        loop = inherited.loop or inherited.booting
        if loop is not None:
            _let_go(loop)
        self._closing = True  # close() has nothing to wait for
        self._close_returned = threading.Event()  # (a copy's lock may be held)
        self._close_returned.set()
        self._closed_why = why
        self._ready = self._renewer = None
        self._client = self._blocking = None
        self._scripts = {}
        self._calls, self._leads = set(), set()
        self._undoing, self._undo_nonces = {}, {}
        if self.on_fork is not None:
            self.on_fork(why)


# What forked children keep of their parents' started groups, for good: collected there,
# a copied redis-py connection would close itself through the copied loop, whose epoll
# instance is the parent's own (an unregister from here unwatches the parent's socket).
_inherited: list[dict[str, Any]] = []


def _let_go(loop: asyncio.AbstractEventLoop) -> None:
    """(In a forked child) point the child's copies of the descriptors ``loop`` watches
    (the parent's Redis connections, its wake-up socket) and of its epoll instance at
    /dev/null: the parent's connections then close when the parent closes them, not
    when this child exits, and nothing done here can reach the parent's through them.
    dup2, not close: the numbers stay taken, so no later file of the child gets one."""
    selector = getattr(loop, "_selector", None)  # asyncio's selector loop (private)
    if selector is None:
        return
    try:
        fds = [key.fd for key in selector.get_map().values()]
        fds.append(selector.fileno())
    except (AttributeError, RuntimeError, OSError):
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    finally:
        os.close(null)


def _refused_as_too_large(exc: BaseException) -> bool:
    """COMPLETE's one deliberate refusal (a value over max_value_bytes), told by its
    text from every other server error, which passes (OOM, BUSY, READONLY, LOADING)."""
    return isinstance(exc, ResponseError) and scripts.OVER_MAX_VALUE_BYTES in str(exc)


def _ms(seconds: float) -> int:
    """A duration for PEXPIRE: at least 1 ms, at most _MAX_TTL_MS (clamped before it
    is rounded: a finite lease or keep near the float maximum overflows in ms)."""
    return max(1, round(min(float(_MAX_TTL_MS), seconds * 1000)))


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _safe(url: str) -> str:
    """A Redis URL as messages show it: without its user and password."""
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.rpartition("@")[2] if sep else url
