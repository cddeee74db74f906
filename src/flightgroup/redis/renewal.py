"""A lead's lease in the fleet scope, while its work runs: renewed, moved to a new token
for a retry, lost.

Every lease of the process is renewed each lease/3, all of them in one RENEW per tick
(per slot on a Cluster). RENEW answering 0 (Redis no longer holds the flight), or no
renewal taken for a whole lease (a frozen or unreachable server), loses it: the work
hears it, its landing will not be taken. A retry asks ATTEMPT for the flight's next
token, which renews the lease too.

``FleetLead.moves`` counts the ATTEMPTs sent plus those heard: odd while one is in
flight. A RENEW whose reply comes back after an ATTEMPT crossed it answers for a token
Redis may have moved on from, so only a reply sent and heard at the same count counts.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from .._log import key_digest, log
from ..scope.events import Lead, LeaseLost
from .clients import RETRY_PAUSE, UNREACHABLE
from .names import FENCE_TTL_MS, Names

if TYPE_CHECKING:
    from .arbiter import RedisArbiter
    from .calls import FleetCall, FleetLead

__all__ = ["Renewal"]


class Renewal:
    """The leases of one group's leads (``arbiter._leads``), on the group's loop.

    ``task`` is the renewing task while the group leads a flight (None before the first
    and in a forked child); it ends when no lead is left, and the next lead starts it
    again."""

    def __init__(self, arbiter: RedisArbiter) -> None:
        self.arbiter = arbiter
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """(On the loop) a lead began: renew its lease from now on."""
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def lose(
        self, lead: FleetLead, reason: str, gone: bool = False, *, unreachable: bool = False
    ) -> None:
        """``lead``'s lease is lost (its work hears it), for ``reason``. ``gone``: Redis
        said it no longer holds the flight (a reply, not silence); ``unreachable``: Redis
        could not be reached for a whole lease."""
        if lead.lose(unreachable=unreachable):
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

    async def run(self) -> None:
        """Renew every lease of this process each lease/3, in one call (per slot)."""
        arbiter = self.arbiter
        while arbiter._leads:
            lease = arbiter._lease
            await asyncio.sleep(lease / 3)
            # A renewal that hangs (a frozen server) must not keep a lease alive here
            # while it runs out in Redis: no renewal taken for a whole lease loses it.
            now = time.monotonic()
            for lead in list(arbiter._leads):
                if not lead.lost and now - lead.renewed_at > lease:
                    self.lose(lead, "no renewal reached Redis for a whole lease", unreachable=True)
            # A flight younger than lease/3 needs no renewal yet (at the next tick it
            # is younger than 2/3 of its lease): a short flight costs two round trips.
            due = now - lease / 3
            # (A lead whose retry's ATTEMPT is in flight is renewed by that ATTEMPT.)
            leads = [
                lead for lead in arbiter._leads
                if not lead.lost and lead.renewed_at <= due and not lead.moves % 2
            ]
            groups: dict[int, list[tuple[FleetLead, int, int]]] = {}
            for lead in leads:
                names = Names(arbiter.namespace, lead.call.key, arbiter._cluster)
                slot = key_slot(names.record.encode()) if arbiter._cluster else 0
                groups.setdefault(slot, []).append((lead, lead.token, lead.moves))
            ended = await asyncio.gather(
                *(self.renew_some(batch) for batch in groups.values()), return_exceptions=True
            )
            for error in ended:  # unexpected: the whole-lease check above still applies
                if isinstance(error, Exception):
                    log.warning("a lease renewal in %s failed: %r", arbiter.namespace, error)

    async def renew_some(self, batch: list[tuple[FleetLead, int, int]]) -> None:
        """One RENEW of ``batch``'s leases: (lead, its token, its moves) as sent."""
        arbiter = self.arbiter
        keys: list[str] = []
        args: list[Any] = [arbiter._lease_ms]
        for lead, token, _ in batch:
            names = Names(arbiter.namespace, lead.call.key, arbiter._cluster)
            keys += [names.record, names.parked(token)]
            args.append(token)
        sent = time.monotonic()
        try:
            # Bounded by lease/3: the client's own timeouts and retries of a server that
            # does not answer take 4 command timeouts, past the next tick.
            renewed = await asyncio.wait_for(
                arbiter._script("renew", keys, args), arbiter._lease / 3
            )
        except (*UNREACHABLE, TimeoutError) as exc:
            now = time.monotonic()
            for lead, _, _ in batch:
                if now - lead.renewed_at > arbiter._lease:
                    self.lose(
                        lead, f"Redis was out of reach for a whole lease ({exc})", unreachable=True
                    )
            return
        for (lead, token, moves), ok in zip(batch, renewed, strict=True):
            # A retry's ATTEMPT sent meanwhile may have run first in Redis (RENEW then
            # answers 0 for the old token) and be heard after this reply: only a reply
            # at the token and moves it was sent with counts.
            if lead.token != token or lead.moves != moves:
                continue
            if int(ok):
                lead.renewed_at = max(lead.renewed_at, sent)
                if int(ok) == 2:  # a FORGET parked it
                    lead.call.detached()
            else:
                self.lose(lead, "Redis no longer holds its flight", gone=True)

    async def next_token(self, call: FleetCall) -> None:
        """A retry of ``call``'s lead: its inbox hears Lead with the new token, or
        LeaseLost."""
        try:
            await self._attempt(call)
        except Exception as exc:  # unexpected: the retry must not wait forever
            if call.lead is not None:
                self.lose(call.lead, f"a retry's new token could not be had: {exc!r}")
            call.inbox.put(LeaseLost("lost"))

    async def _attempt(self, call: FleetCall) -> None:
        arbiter = self.arbiter
        lead = call.lead
        assert lead is not None
        if lead.lost or arbiter._closing:
            call.inbox.put(LeaseLost("the group closed" if arbiter._closing else "lost"))
            return
        names = Names(arbiter.namespace, call.key, arbiter._cluster)
        old = lead.token
        lead.moves += 1  # odd: an ATTEMPT is in flight (see the module)
        try:
            while True:
                sent = time.monotonic()
                try:
                    reply = await arbiter._script(
                        "attempt",
                        [names.record, names.parked(old), names.fence, names.mailbox(old)],
                        [old, call.nonce, arbiter._lease_ms, FENCE_TTL_MS,
                         arbiter._grace_ms(0.0)],
                    )
                except UNREACHABLE as exc:
                    if time.monotonic() - lead.renewed_at > arbiter._lease:
                        reason = f"Redis was out of reach for a whole lease ({exc})"
                        self.lose(lead, reason, unreachable=True)
                        call.inbox.put(LeaseLost("Redis was out of reach"))
                        return
                    await asyncio.sleep(RETRY_PAUSE)
                    continue
                break
            if int(reply[0]) == 0:
                self.lose(lead, "Redis no longer holds its flight", gone=True)
                call.inbox.put(LeaseLost("lost"))
                return
            lead.token, lead.renewed_at = int(reply[1]), sent
        finally:
            lead.moves += 1
        if call.withdrawn or arbiter._closing or lead.work_done:
            # The flight ended here (withdrawn, closed, or landed under the old token)
            # while Redis moved it to this token: nothing else gives it back, and its
            # joiners, following `next`, would wait a whole lease.
            arbiter._leads.discard(lead)
            await arbiter._abandon(lead, "its leader stopped during a retry")
            call.inbox.put(LeaseLost("the group closed" if arbiter._closing else "withdrawn"))
            return
        call.inbox.put(Lead(lead.token))
