"""What a wide scope's flight carries beside the engine's: what its scope told this
process (led here, joined elsewhere, decided), its landing's state, and the links that
fresh callers and takeovers follow. Its table is :class:`~.table.WideTable`.
"""

from __future__ import annotations

import threading
from typing import Any

from ..engine.flight import Flight, Waiter

__all__ = ["WideFlight"]


class WideFlight(Flight):
    """A flight of a wide scope's group. Its fields follow Flight's rule: written
    under the table lock (the outcome fields once, before DONE), class-level defaults."""

    # fresh callers that came before the scope let the work start here: woken with
    # JOINED to join this flight instead of waiting for its end (ran_here)
    promoted: frozenset[Waiter] = frozenset()
    # the scope answered: the work runs here, or the flight joined one led elsewhere.
    # Until then a joiner's on_join waits (``defer_on_join``): the answer may be a kept
    # outcome, and a call served from one never calls on_join.
    decided = False
    led_here = False  # the scope let its work run here (ran_here)
    # the scope could not serve it (unreachable, another version): it counts as no
    # flight, no join and no interruption (docs/observability.md)
    unserved = False
    deferred: list[Waiter] | None = None  # joiners whose on_join waits for the answer
    # ``wide`` is the scope's call while this process leads there; ``remote``: the
    # outcome came from elsewhere (every caller here is a joiner and raises a copy of
    # ``error``); ``joined_remote``: told it joined a flight led elsewhere (the leading
    # caller's on_join is due).
    wide: Any = None
    remote = False
    joined_remote = False
    # ends of sync attempts left running past their deadline: the key is held in the
    # scope until each is set
    stragglers: list[threading.Event] | None = None
    fresh_lead = False  # its leader came with fresh=True (the scope must know)
    # led in this process alone, the scope being out of reach (on_unavailable="local"):
    # it has no call in the scope, and its outcome is neither landed nor kept
    local = False
    # the token of the flight whose end its fresh callers waited for: a flight of the
    # scope that began after that one began after their calls
    after: int | None = None
    # ``token`` may be the ``after`` of its next flight: this process led the flight
    # under the scope's token, and every fresh caller waiting for its end came before
    # its landing was handed to the scope (SETTLING), so before the scope could end it
    # and begin another. Not so for a flight led elsewhere (its end reaches this process
    # after the scope may have begun the next one), a local token (a retry's before the
    # scope bound it), or an end the scope did not see (unreachable, lease lost): its
    # next flight then names no flight, and no flight that exists when it asks will do
    # (ADR 0005).
    scoped = False
    # it left the table (a forget) and, when it ended, its fresh callers went on
    # waiting for the end of the key's flight then (``next``): that one may have joined
    # a flight of the scope that began before their calls
    moved = False
    next: WideFlight | None = None  # (the flight after this one, of the same table)
    # its leading caller stopped waiting (timeout, cancel, interrupt, on_join raised)
    # while the flight goes on: it no longer counts against max_waiters
    leader_left = False
    # the leading caller's waiter that ``joined_remote`` detached: the caller may give
    # up with it before it waits again (``withdraw``)
    rejoining: Waiter | None = None
