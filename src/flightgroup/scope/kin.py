"""The groups of this process that share one wide scope are one group: their kin.

This module owns the register of the wide tables of this process by scope, and what a
call must see of its kin's flights: a call made by a work of a flight that a kin group
runs, or run_sync on the loop of such a flight's work, would wait for itself (I6 across
the groups of one scope; ``WideTable._refuse``). A failure a kin group landed gives its
error as the ``__cause__`` of the FlightFailedError a group here gets from the scope.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from ..engine.flight import Flight
    from .table import WideTable

__all__ = ["kin_of", "register", "runs_in_kin", "scope_blocks"]

# The tables of this process by scope: groups of one scope are one group, and a call
# must see the flights of the others (runs_in_kin, scope_blocks).
_KIN_LOCK = threading.Lock()
_KIN: dict[Hashable, weakref.WeakSet[WideTable]] = {}
_KIN_PRUNE_AT = 64  # scopes registered before the next sweep of those left empty


def register(scope: Hashable, table: WideTable) -> None:
    """``table`` is a group's of ``scope`` in this process (for as long as it lives)."""
    global _KIN_PRUNE_AT
    with _KIN_LOCK:
        if len(_KIN) >= _KIN_PRUNE_AT:
            # Scopes whose groups were all collected (a group per temporary directory),
            # swept when the register doubled: amortised, not a scan per group made.
            for gone in [name for name, tables in _KIN.items() if not tables]:
                del _KIN[gone]
            _KIN_PRUNE_AT = max(64, 2 * len(_KIN))
        _KIN.setdefault(scope, weakref.WeakSet()).add(table)


def _renew_kin_lock() -> None:
    """(In a forked child) another thread of the parent may have held the lock: its
    copy here would stay held for ever."""
    global _KIN_LOCK
    _KIN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_renew_kin_lock)


def kin_of(table: WideTable) -> list[WideTable]:
    """The other tables of ``table``'s scope in this process."""
    with _KIN_LOCK:
        tables = list(_KIN.get(table.scope, ()))
    return [other for other in tables if other is not table]


def runs_in_kin(table: WideTable, tkey: Hashable, current: Flight | None) -> bool:
    """True if ``current``, or a flight whose work started it, is a flight of the key
    ``tkey`` that another group of this process with ``table``'s scope runs: the scope
    would make this call join it (or wait for its key lock), so its work would wait for
    itself. A flight whose work is over (a task it started may outlive it) does not
    count."""
    tables: list[WideTable] | None = None
    while current is not None:
        if current.tkey == tkey:
            if tables is None:
                tables = kin_of(table)
            if any(other.holds(current) for other in tables):
                return True
        current = current.parent
    return False


def scope_blocks(table: WideTable, tkey: Hashable, loop: asyncio.AbstractEventLoop) -> bool:
    """(Under ``table``'s lock) True if a flight of ``tkey`` whose async work runs on
    ``loop`` here (not known to be led elsewhere) is another table's of this scope in
    this process, or (directory scope) left its table while its work runs (``table``'s
    check of its own flight comes later). Read from the other tables without their
    locks: each test is one atomic read."""
    # A flight that left its table holds the key in the directory scope (its key
    # lock); in the fleet only until the scope confirms its forget(): after that a
    # new call leads beside it (its lease is lost).
    left_holds = table.left_holds
    for each in (table, *kin_of(table)):
        if each is not table:
            flight = each.flights.get(tkey)
            if flight is not None and flight.loop is loop and not flight.joined_remote:
                return True
        if left_holds or tkey in each.forgetting:
            for left in (*each.detached, *each.lingering):
                if left.tkey == tkey and left.loop is loop and not left.joined_remote:
                    return True
    return False
