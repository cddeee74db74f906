"""Locks that a forked child gets back unlocked.

``os.fork`` copies a lock as it is: one that another thread of the parent held at the
fork stays held in the child for ever, and the child's first use of it hangs. A lock
that guards only its holder's own state (an exporter's, a module's) is made anew in the
child through :func:`renew_after_fork`; the flight tables and the wide scopes' loops
(``scope/loop.py``), which must also drop what the fork copied, have at-fork hooks of
their own.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["renew_after_fork"]

# holder (an object or a module) -> the names of its lock attributes
_HOLDERS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def renew_after_fork(holder: Any, name: str = "_lock") -> None:
    """Give ``holder`` a new ``threading.Lock`` as its attribute ``name`` in every
    forked child (a module's global too: pass the module)."""
    _HOLDERS.setdefault(holder, set()).add(name)


def _after_fork() -> None:
    for holder, names in list(_HOLDERS.items()):
        for name in names:
            setattr(holder, name, threading.Lock())


os.register_at_fork(after_in_child=_after_fork)
