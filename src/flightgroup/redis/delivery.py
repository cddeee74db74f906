"""How a flight's outcome reaches the calls that wait for it in other processes.

The leader's landing (COMPLETE) appends the outcome to the flight's mailbox, a stream
named by its token. A waiting call reads that stream from its start with a blocking
XREAD, on a client whose socket timeout exceeds the block and which never re-sends:
the outcome is pushed, and no order of "starts reading" and "the leader lands" loses
it. A call submitted from an event loop that joined before reads on that loop
(``read_here``, with its loop's client from :mod:`.readers`: the reply resumes the
caller with no hop between threads, ADR 0056); a thread's call, a Cluster's, and a
loop's first join (ADR 0058), on the group's loop (``read_outcome``). Both make the
same decisions (``_Reading``). A read that ends empty past the flight's lease, or
cannot reach Redis, asks CHECK instead: the flight is gone (its leader stopped
renewing), still running (wait for its new lease), or ended (its mailbox entry).

A retry moves the flight to a new token: the old mailbox says ``next`` and its new
token, and a joiner follows it. A FORGET elsewhere parks a flight and writes a notice
beside its mailbox, which a joiner that asked for it reads too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from ..scope.events import Joined, Landed, NoOutcome, Refused
from .clients import MAX_BLOCK, RETRY_PAUSE, UNREACHABLE
from .outcomes import decode_outcome

if TYPE_CHECKING:
    from .arbiter import RedisArbiter
    from .calls import FleetCall
    from .names import Names

__all__ = ["fields_of", "read_here", "read_outcome"]

_SLACK = 0.05  # a joiner's clock starts after the reply: wait this much past the lease


async def read_outcome(
    arbiter: RedisArbiter,
    call: FleetCall,
    names: Names,
    token: int,
    pttl: int,
    *,
    follow: bool,
) -> Landed | NoOutcome | Refused:
    """Wait for flight ``token``'s outcome (its lease has ``pttl`` ms left): the event
    that ends ``call``. ``follow``: a retry's new token is told to the call (Joined)
    and followed. Runs on ``arbiter``'s loop, with its blocking client."""
    joined = functools.partial(_tell_joined, call) if follow else None
    return await _Reading(
        arbiter, call, names, token, pttl, joined=joined, client=arbiter._blocking,
        on_group=True, since=time.monotonic(),
    ).outcome()


async def read_here(
    arbiter: RedisArbiter,
    call: FleetCall,
    names: Names,
    token: int,
    pttl: int,
    answered: float,
    joined: Callable[[int], None],
) -> Landed | NoOutcome | Refused:
    """(A Follow's read, on ``call``'s own loop) :func:`read_outcome` with that loop's
    client: the reply resumes its driver there, with no hop between threads. ``pttl``
    was the lease left when ACQUIRE answered, at ``answered`` (monotonic). Each retry's
    new token is told to ``joined``. The group's close cancels the read: the call then
    ends refused, as closed."""
    task = asyncio.current_task()
    call.reader = task  # (before withdrawn is read: close sets it, then cancels this)
    try:
        client = await arbiter._readers.client(asyncio.get_running_loop())
        if client is None:
            return Refused(arbiter._closed())
        return await _Reading(
            arbiter, call, names, token, pttl, joined=joined, client=client, on_group=False,
            since=answered,
        ).outcome()
    except asyncio.CancelledError:
        if not arbiter._closing:
            raise
        # The group's close cancelled the read, or stopped its loop under a CHECK.
        if task is not None and task.cancelling():
            task.uncancel()
        return Refused(arbiter._closed())
    except Exception as exc:  # one the steps do not expect: unavailable, as on the group
        return Refused(arbiter._unavailable(exc))  # (see RedisArbiter._acquire_ended)
    finally:
        call.reader = None
        arbiter._calls.discard(call)  # (a set's discard is atomic: see closing.py)


def _tell_joined(call: FleetCall, token: int) -> None:
    call.inbox.put(Joined(token, 0, 0.0, ""))


class _Reading:
    """One call's wait for one flight's outcome (see read_outcome), with ``client``, on
    the group's loop (``on_group``) or on the call's own."""

    __slots__ = (
        "arbiter", "call", "client", "deadline", "joined", "names", "on_group", "token",
        "unreachable",
    )

    def __init__(
        self,
        arbiter: RedisArbiter,
        call: FleetCall,
        names: Names,
        token: int,
        pttl: int,
        *,
        joined: Callable[[int], None] | None,
        client: Any,
        on_group: bool,
        since: float,
    ) -> None:
        self.arbiter = arbiter
        self.call = call
        self.names = names
        self.token = token
        self.joined = joined  # told a retry's new token, which is then followed
        self.client = client
        self.on_group = on_group
        # Past it, a read that ended empty asks CHECK: the flight's lease (then its new
        # lease, as CHECK tells) plus what the reply took to come, from when ``pttl``
        # was read (``since``: a busy caller loop may start the read later).
        self.deadline = since + max(pttl, 0) / 1000 + _SLACK
        self.unreachable: BaseException | None = None  # the last read's error

    async def outcome(self) -> Landed | NoOutcome | Refused:
        while True:
            if self.call.withdrawn:
                # Withdrawn while a CHECK ran (only a read is cancelled): a read begun
                # now would hold its connection to the flight's end, and close() wait.
                if self.arbiter._closing:
                    return Refused(self.arbiter._closed())
                return NoOutcome("withdrawn")
            fields: dict[bytes, bytes] | None = None
            left = self.deadline - time.monotonic()
            if left > 0:
                fields, again = await self._read(left)
                if again:
                    continue
            if fields is None:
                checked = await self._check()
                if checked is None:
                    continue
                if not isinstance(checked, dict):
                    return checked
                fields = checked
            code = fields.get(b"c")
            if code == b"next":  # a retry: the flight goes on under a new token
                self.token = int(fields.get(b"v", b"0"))
                if self.joined is not None:
                    self.joined(self.token)
                # Ask CHECK first: the flight's own lease left (the leader's, not ours).
                self.deadline = time.monotonic()
                continue
            return Landed(self.token, decode_outcome(code, fields.get(b"v")), False)

    async def _read(self, left: float) -> tuple[dict[bytes, bytes] | None, bool]:
        """One blocking XREAD of the mailbox (at most ``left`` s): its entry, or None;
        and whether to read again rather than ask CHECK."""
        call, arbiter = self.call, self.arbiter
        block = min(left, MAX_BLOCK)
        mailbox = self.names.mailbox(self.token)
        streams = {mailbox: b"0"}
        # A joiner also reads the flight's notice (a FORGET parked it), until heard.
        notice = self.names.notice(self.token) if self.joined and call.on_detached else None
        if notice is not None:
            streams[notice] = b"0"
        if self.on_group:
            call.reading = True  # (close and a withdrawal cancel only a read)
        try:
            # Bounded by its own block (plus a command's time), not by the client's
            # socket timeout past the longest block, so that a frozen server holds a
            # joiner no longer than the flight's lease (a stall of this process's own
            # is not counted: see _bounded).
            reply = await _bounded(
                self.client.xread(streams, count=1, block=max(1, round(block * 1000))),
                limit=block + arbiter._timeout,
                extra=arbiter._timeout,
            )
            self.unreachable = None
        except UNREACHABLE as exc:
            self.unreachable, reply = exc, None
            if self.on_group:
                arbiter._breaker.saw(exc)
            else:
                arbiter._background.post(arbiter._breaker.saw, exc)
            await asyncio.sleep(RETRY_PAUSE)
        finally:
            if self.on_group:
                call.reading = False
        if reply:
            entries = _entries(reply)
            if notice is not None and notice in entries:
                call.detached()
            fields = entries.get(mailbox)
            return fields, fields is None  # only the notice: read the mailbox again
        # A capped block ended: read again (past the deadline, or unreachable: CHECK).
        return None, self.unreachable is None and time.monotonic() < self.deadline

    async def _check(self) -> dict[bytes, bytes] | NoOutcome | Refused | None:
        """Ask CHECK: the flight's mailbox entry, the event that ends the call, or None
        to wait again (its lease was renewed, or Redis is out of reach for now)."""
        arbiter, names, token = self.arbiter, self.names, self.token
        check = arbiter._script(
            "check", [names.record, names.parked(token), names.mailbox(token)], [token]
        )
        try:
            checked = await (check if self.on_group else _on_group(arbiter, check))
        except UNREACHABLE as exc:
            if time.monotonic() > self.deadline + arbiter._lease:
                return Refused(arbiter._unavailable(exc))
            await asyncio.sleep(RETRY_PAUSE)
            return None
        if int(checked[0]) == 0:
            if self.unreachable is not None:
                return NoOutcome("Redis lost its flight while it was unreachable")
            return NoOutcome("its leader stopped renewing its lease")
        if int(checked[0]) == 2:
            self.deadline = time.monotonic() + max(int(checked[1]), 0) / 1000 + _SLACK
            return None
        return fields_of(checked[1])


async def _on_group(arbiter: RedisArbiter, step: Coroutine[Any, Any, Any]) -> Any:
    """``step``'s result, run on the group's loop (its command client lives there)."""
    loop = arbiter._background.loop
    future = None
    if loop is not None:
        with contextlib.suppress(RuntimeError):  # the group's loop stopped: it closed
            future = asyncio.run_coroutine_threadsafe(step, loop)
    if future is None:
        step.close()
        raise asyncio.CancelledError  # (read_here: the call ends as closed)
    return await asyncio.wrap_future(future)


async def _bounded(read: Coroutine[Any, Any, Any], *, limit: float, extra: float) -> Any:
    """``read``'s reply, waited for ``limit`` s, then up to ``extra`` s more before it
    is given up (TimeoutError). The limit's timer may fire in the same loop turn as the
    reply's bytes come, or before the read parsed them: a process stopped past the
    limit (SIGSTOP) while its leader landed has the reply in its socket already, and
    reads it rather than time it out (and then find the mailbox expired). So the limit
    only starts the ``extra`` window, counted from when its timer runs; the read is
    cancelled once that passes (redis-py then drops its connection, never reused with
    a reply pending). Awaited in this task, with no task of its own: the reply resumes
    the caller in the turn it is parsed."""
    loop = asyncio.get_running_loop()
    window = asyncio.timeout(None)  # no deadline until the limit's timer runs
    limited = loop.call_later(limit, lambda: window.reschedule(loop.time() + extra))
    try:
        async with window:
            return await read
    except TimeoutError:
        if window.expired():
            raise TimeoutError(f"no reply within {limit + extra:g} s") from None
        raise
    finally:
        limited.cancel()


def fields_of(flat: Sequence[Any]) -> dict[bytes, bytes]:
    """A stream entry's or a hash's flat [name, value, ...] reply as a dict."""
    return {flat[i]: flat[i + 1] for i in range(0, len(flat) - 1, 2)}


def _entries(reply: Any) -> dict[str, dict[bytes, bytes]]:
    """Stream name -> the fields of its one entry, from an XREAD reply in either
    protocol's shape: RESP2 ``[[stream, [(id, fields)]], ...]``; RESP3 (a URL with
    ``?protocol=3``) a dict ``{stream: ...}`` whose entries redis-py wraps once more (8.x)."""
    streams = reply.items() if isinstance(reply, dict) else reply
    found: dict[str, dict[bytes, bytes]] = {}
    for stream, node in streams:
        while not isinstance(node[0], (bytes, str)):
            node = node[0]  # down to the entry, (id, fields): only its first item is an ID
        fields = node[1]
        name = stream.decode() if isinstance(stream, bytes) else stream
        found[name] = fields if isinstance(fields, dict) else fields_of(fields)
    return found
