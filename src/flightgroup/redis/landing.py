"""A lead's landing in the fleet scope: COMPLETE, tried again while its lease runs.

COMPLETE hands the outcome to the flight's mailbox (its joiners read it there, see
:mod:`.delivery`) and keeps it where retention asks, unless the flight is no longer
this leader's (fenced: its joiners are told it was interrupted). A passing server
error, or an unreachable server, is tried again within the lease; past it the lease is
lost. What became of the landing is a :class:`~..scope.interface.Handed`, which the
engine settles the flight by.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from .._log import DigestOf, key_digest, log
from ..errors import UnavailableError
from ..scope.interface import Handed
from . import scripts
from .clients import RETRY_PAUSE, UNREACHABLE
from .names import MAX_TTL_MS, Names
from .outcomes import encode_outcome, kept_bounds

if TYPE_CHECKING:
    from ..scope.outcome import SharedOutcome
    from .arbiter import RedisArbiter
    from .calls import FleetLead

__all__ = ["complete"]


async def complete(arbiter: RedisArbiter, lead: FleetLead, outcome: SharedOutcome) -> Handed:
    """COMPLETE ``lead``'s flight with ``outcome`` (on ``arbiter``'s loop), tried again
    while its lease runs: what became of the landing."""
    call = lead.call
    names = Names(arbiter.namespace, call.key, arbiter._cluster)
    token = lead.token
    code, payload, keep = encode_outcome(outcome)
    size, max_items, max_bytes = kept_bounds(outcome)
    refusals = 0  # passing server errors heard (the first one is logged)
    began = time.monotonic()
    while True:
        try:
            reply = await arbiter._script(
                "complete",
                [names.record, names.parked(token), names.mailbox(token), *names.kept],
                [token, code, payload, round(min(float(MAX_TTL_MS), keep * 1000)),
                 arbiter._grace_ms(keep), arbiter._max_value_bytes, size, max_items, max_bytes],
            )
        except UNREACHABLE as exc:
            if _refused_as_too_large(exc):  # COMPLETE's own refusal: final
                log.warning("Redis refused a landing of %s: %s", key_digest(call.key), exc)
                await arbiter._abandon(lead, "Redis refused its leader's landing")
                return Handed(fenced=True)
            # Out of reach, or a passing server error (OOM under noeviction, BUSY,
            # READONLY in a failover, LOADING): the lease still runs, so try again within
            # it. Bounded by a lease from the landing's start too: RENEW may be taken
            # meanwhile (PEXPIRE is no write OOM refuses) while COMPLETE is refused for
            # good.
            if time.monotonic() - min(lead.renewed_at, began) > arbiter._lease:
                return await _not_taken(arbiter, lead, exc)
            if isinstance(exc, ResponseError) and not refusals:
                log.info("Redis refused a landing of %s for now, trying again: %s",
                         key_digest(call.key), exc)
            refusals += isinstance(exc, ResponseError)
            await asyncio.sleep(RETRY_PAUSE)
            continue
        fenced = int(reply[0]) == 0
        log.debug("%s %s: %s, token %d", arbiter.namespace, DigestOf(call.key),
                  "fenced" if fenced else "landed", token)
        return Handed(fenced=fenced)


async def _not_taken(arbiter: RedisArbiter, lead: FleetLead, exc: BaseException) -> Handed:
    """Redis did not take ``lead``'s landing for a lease (the last error ``exc``): the
    lease is lost."""
    arbiter._renewal.lose(
        lead, f"Redis did not take its landing for a lease ({exc})", unreachable=True
    )
    if isinstance(exc, ResponseError):  # it answers: tell the joiners
        await arbiter._abandon(lead, "Redis refused its leader's landing")
        return Handed(fenced=True)
    # Unheard, not refused: Redis may have run a COMPLETE whose reply was lost, and its
    # joiners have the outcome. The leader cannot tell, so it does not say the lease was
    # lost.
    unconfirmed = UnavailableError(
        f"Redis at {arbiter._where()} did not confirm the landing "
        f"for a lease, so its joiners may have its outcome: {exc!r}"
    )
    unconfirmed.__cause__ = exc  # (the work's error, if any, then)
    return Handed(fenced=True, unconfirmed=unconfirmed)


def _refused_as_too_large(exc: BaseException) -> bool:
    """COMPLETE's one deliberate refusal (a value over max_value_bytes), told by its
    text from every other server error, which passes (OOM, BUSY, READONLY, LOADING)."""
    return isinstance(exc, ResponseError) and scripts.OVER_MAX_VALUE_BYTES in str(exc)
