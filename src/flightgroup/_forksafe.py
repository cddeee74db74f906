"""Locks that a forked child gets back unlocked.

``os.fork`` copies a lock as it is: one that another thread of the parent held at the
fork stays held in the child for ever, and the child's first use of it hangs. The
engine's own locks are made anew by the modules that own them (flight.py, lease.py, the
arbiters); this is for the exporters' objects, whose locks guard only their own state.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["renew_after_fork"]

_HOLDERS: weakref.WeakSet[Any] = weakref.WeakSet()


def renew_after_fork(holder: Any) -> None:
    """Give ``holder`` a new ``_lock`` (a ``threading.Lock``) in every forked child."""
    _HOLDERS.add(holder)


def _after_fork() -> None:
    for holder in list(_HOLDERS):
        holder._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
