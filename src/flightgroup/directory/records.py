"""What a coordinator knows of each key: the records of its flights, the calls waiting for
a key's lock, and the outcomes it keeps after a flight ended (the endings of the rejoin
window, the kept outcomes of Retention).

Everything here is state touched only on the coordinator's event loop; what to do with it
(lead or join, deliver, detach) is :mod:`.coordinator`'s. The one I/O: the kept outcomes
are mirrored to their files (:mod:`.keptfiles`) as they come and go, so that the next
term serves them too (ADR 0039).

Tokens: a flight that retries gets a new token per attempt, and a process may have
missed some of them (a `joined` or `lead` frame lost with a coordinator that died).
So a flight keeps every token it had that this coordinator heard of (its reassert's
``earlier`` tokens, its attempts here; the latest ``wire.MAX_EARLIER + 1``): a rejoin
names its flight if any of its tokens is one of them, and an ending is kept under each.
Which of two flights of a key is newer is decided by their current tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..retention import RetentionStore
from ..scope.outcome import Failure, SharedOutcome, Value, kept_size
from . import wire
from .keptfiles import KeptFiles, Record

if TYPE_CHECKING:
    from .server import Session

__all__ = [
    "KEPT_MAX_BYTES",
    "KEPT_MAX_ITEMS",
    "Ending",
    "Flight",
    "Outcomes",
    "Waiting",
    "add_tokens",
    "began_after",
    "rejoin_tokens",
]

# Kept outcomes (Retention): the bounds when a landing names none (a peer of an earlier
# release); max_bytes absent is this coordinator's memory guard.
KEPT_MAX_ITEMS = 10_000
KEPT_MAX_BYTES = 256 * 1024 * 1024
_TOKENS_MAX = wire.MAX_EARLIER + 1  # the tokens a flight keeps: its current and earlier ones

log = logging.getLogger("flightgroup")


@dataclass(eq=False)
class Flight:
    """The coordinator's record of a flight: its leader (session and request id) and
    its joiners. ``reasserted``: born in an earlier term."""

    key: str
    token: int  # the current attempt's
    leader: Session | None
    lead_id: int
    started: float
    reasserted: bool = False
    # Not the key's current flight: a forget() detached it, or it reasserted a landing
    # while a newer flight of the key ran. It serves its own joiners and rejoins by
    # token, never a new call (see Coordinator._detached).
    detached: bool = False
    # It reasserted a landing (its `land` follows on its leader's connection): a newer
    # flight that reasserts meanwhile detaches it instead of refusing it (ADR 0022).
    landed: bool = False
    # every token the flight had that this coordinator knows (``token`` too)
    tokens: set[int] = field(default_factory=set)
    ended: bool = False  # landed or interrupted: it is nobody's to end again
    # (session, request id) -> None, in join order
    joiners: dict[tuple[Session, int], None] = field(default_factory=dict)
    # fresh runs waiting for this flight's end: (session, request id)
    fresh: list[tuple[Session, int]] = field(default_factory=list)


def began_after(flight: Flight, after: int | None) -> bool:
    """``flight`` began after the flight whose last token is ``after`` (its first token
    is higher: a key's flights take ever higher tokens); None: no flight that exists
    began after a fresh call that comes now."""
    return after is not None and min(flight.tokens, default=flight.token) > after


def add_tokens(flight: Flight, tokens: frozenset[int] | set[int]) -> None:
    """``flight`` had ``tokens`` too; it keeps the latest ``_TOKENS_MAX`` (the highest:
    tokens only grow from attempt to attempt)."""
    flight.tokens |= tokens
    while len(flight.tokens) > _TOKENS_MAX:
        flight.tokens.discard(min(flight.tokens))


def rejoin_tokens(run: wire.Run) -> frozenset[int]:
    """The tokens of the flight a rejoining ``run`` names."""
    assert run.flight is not None
    return frozenset((run.flight, *run.earlier))


@dataclass(eq=False)
class Waiting:
    """A run or rejoin waiting for a key whose lock another process holds."""

    session: Session
    id: int
    rejoin: frozenset[int] | None  # the tokens of the flight a rejoin wants, else None
    fresh: bool
    after: int | None = None  # (fresh) a flight that began after this token's will do


@dataclass
class Ending:
    """The outcome of a reasserted flight, kept for the rejoin window."""

    key: str
    token: int  # the flight's last token (a `landed` carries it)
    outcome: SharedOutcome
    until: float


class Outcomes:
    """The outcomes a coordinator keeps once their flight ended.

    The rejoin window: the outcome of a flight reasserted in this term (born in an
    earlier one) is kept ``rejoin_window`` seconds after it ends, under each of its
    tokens, so a joiner that reconnects after its leader landed still gets it.
    Kept outcomes (Retention): the engine's own store; expired ones go before any live
    one is evicted, and each keep passes its landing's bounds. With ``files``, every
    kept outcome has its file while it is in the store, and only then (ADR 0039): each
    removal from the store removes the file in the same step."""

    __slots__ = ("_files", "endings", "kept")

    def __init__(self, files: KeptFiles | None = None) -> None:
        self.endings: dict[int, Ending] = {}
        self.kept = RetentionStore(KEPT_MAX_ITEMS, KEPT_MAX_BYTES)
        self._files = files

    def end(self, flight: Flight, outcome: SharedOutcome, window: float) -> None:
        """``flight`` ended with ``outcome``: kept ``window`` seconds under every token
        of the flight (a joiner may rejoin by any of them)."""
        now = time.monotonic()
        ending = Ending(flight.key, flight.token, outcome, now + window)
        for token in flight.tokens:
            self.endings[token] = ending
        self._purge(now)

    def ending(self, token: int) -> Ending | None:
        ending = self.endings.get(token)
        if ending is not None and ending.until < time.monotonic():
            del self.endings[token]
            return None
        return ending

    def ending_of(self, tokens: frozenset[int]) -> Ending | None:
        """The kept ending of the flight that had (any of) ``tokens``."""
        for token in tokens:
            ending = self.ending(token)
            if ending is not None:
                return ending
        return None

    def last_ended(self, key: str) -> int:
        """The highest token of ``key`` with a kept ending (0: none). Asked on a
        reassert, which is rare (after a failover): a scan is fine."""
        return max((t for t, e in self.endings.items() if e.key == key), default=0)

    def _purge(self, now: float) -> None:
        for token in [t for t, e in self.endings.items() if e.until < now]:
            del self.endings[token]

    def keep(self, key: str, token: int, outcome: Value | Failure, seconds: float) -> None:
        """Keep ``outcome`` as ``key``'s for ``seconds``, under the bounds its leader's
        Retention set (absent: the coordinator's own). An outcome over ``max_bytes``
        alone is not kept (and the key's older one goes); then the least recently used
        others are evicted until at most ``max_items`` and ``max_bytes`` remain."""
        self._put(key, token, outcome, seconds, time.monotonic())

    def _put(
        self, key: str, token: int, outcome: Value | Failure, seconds: float, at: float | None
    ) -> None:
        """Put ``outcome`` in the store; write its file as kept ``at`` (None: loaded from
        its file, which stays as it is)."""
        max_items = outcome.max_items if outcome.max_items is not None else KEPT_MAX_ITEMS
        max_bytes = outcome.max_bytes if outcome.max_bytes is not None else KEPT_MAX_BYTES
        # Expired outcomes leave first; the new one is never evicted by its own keep.
        entry, removed = self.kept.put(
            key, isinstance(outcome, Value), outcome, token, seconds,
            kept_size(outcome), (max_items, max_bytes),
        )
        files = self._files
        if files is None:
            return
        for each in removed:
            if entry is None or each.key != key:  # the key's own file is replaced below
                files.remove(str(each.key))
        if entry is not None and at is not None:
            files.write(Record(key, token, outcome, entry.expires, at))

    def load(self) -> None:
        """(At the start of a term) keep the outcomes the terms before kept, with the
        time each has left, in the order they were kept (so the latest bounds decide)."""
        files = self._files
        if files is None:
            return
        try:
            now = time.monotonic()
            for record in files.load(KEPT_MAX_BYTES):
                left = record.expires - now
                if left > 0:
                    self._put(record.key, record.token, record.outcome, left, None)
                else:
                    files.remove(record.key)
        except Exception as exc:  # kept outcomes save work: never a reason not to serve
            log.warning(
                "cannot load the kept outcomes of earlier terms (%s): dropped them all",
                type(exc).__qualname__,
            )
            self.kept.clear()
            files.clear()

    def kept_of(self, key: str) -> tuple[int, SharedOutcome] | None:
        """The token and outcome kept for ``key``, if any."""
        entry = self.kept.get(key)  # a hit counts as a use (LRU); an expired one goes
        if entry is None:
            if self._files is not None:
                self._files.remove(key)  # a set lookup unless the key has a file
            return None
        outcome: SharedOutcome = entry.payload
        return entry.token, outcome

    def drop_kept(self, key: str, *, forgotten: bool = False) -> None:
        """``key``'s kept outcome goes, its file too; ``forgotten`` (a ``forget()``):
        whatever file the key has, even one this term could not read."""
        self.kept.discard(key)
        if self._files is not None:
            self._files.remove(key, always=forgotten)

    def led_past(self, key: str) -> None:
        """A new flight of ``key`` is its current one: its kept outcome ends with that
        flight (replaced or dropped when it ends), so a next term must not serve it if
        this one stops first. Until then the flight shadows it here. Its file goes."""
        if self._files is not None:
            self._files.remove(key)
