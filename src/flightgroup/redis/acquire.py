"""A call's ACQUIRE in the fleet scope, and what its answer starts.

One round trip (scripts.ACQUIRE) answers: lead (the call gets its lead and the lease
is renewed from now on), join (it waits for the flight's outcome, see
:mod:`.delivery`), a kept outcome (served at once), or, for a fresh call, wait for the
running flight's end and ask again for a newer one. An ACQUIRE that got no answer may
still have led: it is undone (:mod:`.undo`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import TYPE_CHECKING

from .._log import DigestOf, log
from ..scope.events import Follow, Joined, Landed, Refused
from .clients import UNREACHABLE
from .delivery import read_here, read_outcome
from .names import FENCE_TTL_MS, Names
from .outcomes import decode_outcome
from .undo import undo_later

if TYPE_CHECKING:
    from .arbiter import RedisArbiter
    from .calls import FleetCall

__all__ = ["acquire"]

_NO_FLIGHT_YET = 2**53  # a fresh call's first ACQUIRE: no flight that exists now is new
_ANSWERS = {1: "lead", 2: "join", 3: "kept", 4: "wait for the next flight"}


async def acquire(arbiter: RedisArbiter, call: FleetCall) -> None:
    """(On ``arbiter``'s loop) ask Redis to lead or join ``call``'s key, and follow the
    answer to the event that ends the call, or to its lead."""
    if arbiter._fatal is not None:
        arbiter._end(call, Refused(arbiter._unavailable(arbiter._fatal)))
        return
    names = Names(arbiter.namespace, call.key, arbiter._cluster)
    await _ready_for(arbiter, names)
    # A fresh call takes a flight from min_token on: one newer than the flight its
    # callers waited for here, else one newer than every flight there is now.
    min_token, after = 0, None
    if call.fresh:
        after = call.after  # (if Redis knows it forgotten, none that exists will do)
        min_token = _NO_FLIGHT_YET if after is None else after + 1
    while True:
        sent = time.monotonic()
        args = [call.nonce, arbiter._lease_ms, FENCE_TTL_MS, min_token, arbiter._pid,
                arbiter._host, call.key.encode("utf-8", "surrogatepass")]
        if after is not None:
            args.append(after)
        try:
            reply = await arbiter._script(
                "acquire", [names.record, names.fence, *names.kept], args
            )
        except UNREACHABLE as exc:
            arbiter._end(call, Refused(arbiter._unavailable(exc)))
            undo_later(arbiter, call.key, names, call.nonce)
            return
        kind, token = int(reply[0]), int(reply[1])
        log.debug("%s %s: %s, token %d", arbiter.namespace, DigestOf(call.key),
                  _ANSWERS.get(kind, "?"), token)
        if kind == 1:
            arbiter._lead(call, names, token, sent)
            return
        if call.withdrawn:
            arbiter._calls.discard(call)
            return
        if kind == 3:
            arbiter._end(call, Landed(token, decode_outcome(reply[2], reply[3]), True))
            return
        if kind == 2:
            age = int(reply[5]) / 1e6
            call.inbox.put(Joined(token, int(reply[3]), age, reply[4].decode()))
            if call.loop is not None and arbiter._readers.reads_on(call.loop):
                # Its driver reads the outcome on its own loop; the call stays in
                # _calls (close() cancels that read) until the read ends.
                read = functools.partial(
                    read_here, arbiter, call, names, token, int(reply[2]), time.monotonic()
                )
                call.inbox.put(Follow(read))
                return
            ended = await read_outcome(arbiter, call, names, token, int(reply[2]), follow=True)
            arbiter._end(call, ended)
            return
        # kind 4 (fresh): the flight that runs began before this call; after its
        # end, the first flight from the next token on is this call's.
        ended = await read_outcome(arbiter, call, names, token, int(reply[2]), follow=False)
        if call.withdrawn:
            arbiter._calls.discard(call)
            return
        if isinstance(ended, Landed):
            # It may have ended under a retry's token: ask from past that one, so
            # that its kept outcome is never taken for a newer flight's.
            token = max(token, ended.token)
        min_token, after = token + 1, None  # the flight it waited for ended after it


async def _ready_for(arbiter: RedisArbiter, names: Names) -> None:
    """Wait (bounded) for what an ACQUIRE of ``names`` must not run before."""
    if arbiter._cluster and arbiter._ready is not None and not arbiter._ready.done():
        # A Cluster client's first commands race its discovery (see clients.startup):
        # wait for it, at most a command timeout. A single server's scripts need no
        # wait (a missing one costs a NOSCRIPT round trip): a frozen server fails
        # the first call in 4 command timeouts, as any other, not in 8.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(arbiter._ready), arbiter._timeout)
    undo = arbiter._undoing.get(names.record)
    if undo is not None and not undo.done():
        # A flight an unanswered ACQUIRE of the key may have led: this call would
        # join it and wait its lease out. Redis out of reach: the ACQUIRE says so.
        await asyncio.wait({undo}, timeout=arbiter._timeout)
