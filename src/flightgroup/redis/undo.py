"""Ending the flights that ACQUIREs which got no answer may have led (ADR 0024).

An ACQUIRE whose reply never came (Redis out of reach, frozen) may still run once the
server resumes, and lead a flight nobody here runs: its joiners would wait its lease
out. Each such ACQUIRE's nonce is undone (scripts.UNDO) by one task per key, until
Redis answers, then once more: Redis reads every connection that was waiting in its
first pass after it resumes, and the second try is sent after the first one's answer,
so after each buffered ACQUIRE of ours has run. A new call of the key waits (bounded)
for that task first, or it would join the flight being undone.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .._log import key_digest, log
from .clients import RETRY_PAUSE, UNREACHABLE

if TYPE_CHECKING:
    from .arbiter import RedisArbiter
    from .names import Names

__all__ = ["undo_later"]


def undo_later(arbiter: RedisArbiter, key: str, names: Names, nonce: str) -> None:
    """(On the loop) the ACQUIRE of ``key`` sent with ``nonce`` got no answer: undo the
    flight it may have led. ``arbiter._undoing`` holds the key's one undoing task and
    ``arbiter._undo_nonces`` its nonces, until it ends."""
    record = names.record
    arbiter._undo_nonces.setdefault(record, []).append(nonce)
    running = arbiter._undoing.get(record)
    if running is not None and not running.done():
        return  # it undoes this nonce too: one task per key, however many calls failed
    task = arbiter._undoing[record] = arbiter._background.spawn(_undo(arbiter, key, names))

    def ended(task: asyncio.Task[None]) -> None:
        if arbiter._undoing.get(record) is task:
            del arbiter._undoing[record]
            arbiter._undo_nonces.pop(record, None)

    task.add_done_callback(ended)


async def _undo(arbiter: RedisArbiter, key: str, names: Names) -> None:
    """Undo each nonce of the key's record, until Redis answered it twice (see the
    module). Nonces of calls that fail meanwhile join in; a closing group stops at the
    first failure."""
    nonces = arbiter._undo_nonces.setdefault(names.record, [])
    answered: dict[str, int] = {}
    grace, reason = arbiter._grace_ms(0.0), "its leading call got no answer from Redis"
    pause = RETRY_PAUSE
    while pending := [n for n in nonces if answered.get(n, 0) < 2]:
        try:
            for nonce in pending:
                if await arbiter._script("undo", [names.record], [nonce, grace, reason]):
                    log.info("ended a flight of %s that a call led with no answer "
                             "from Redis", key_digest(key))
                answered[nonce] = answered.get(nonce, 0) + 1
        except UNREACHABLE:
            if arbiter._closing:
                return
            # The next try goes out once the probe heard Redis again, not a whole
            # pause later: a key's next call waits for this undo.
            await asyncio.sleep(RETRY_PAUSE)
            await arbiter._breaker.wait_reachable(pause)
            pause = min(2 * pause, 1.0)
