"""The errors of failures a group landed, kept for the ``__cause__`` of the
FlightFailedError that callers of this process get back from the scope (ADR 0023)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Hashable

from .._forksafe import renew_after_fork

__all__ = ["CAUSE_SLACK", "KeptCauses"]


# Seconds a landed failure's error is remembered past its keep time (none when it is
# not kept): the scope keeps, or hands to joiners, an outcome from when it reads the
# landing, which a busy or stopped coordinator or Redis may do that much later.
CAUSE_SLACK = 30.0


class KeptCauses:
    """The errors of failures a group landed, by (key, token), while a group of this
    process may get them back from the scope: kept (Retention), or joined from another
    group of the same scope. Such a caller raises FlightFailedError with the very error
    as ``__cause__`` (docs/api.md: "in the same process ``__cause__`` is E"; ADR 0023).

    Bounded: at most ``limit`` errors (the oldest go first), each for its own time."""

    __slots__ = ("__weakref__", "_errors", "_limit", "_lock")

    def __init__(self, limit: int = 1024) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        renew_after_fork(self)
        self._errors: collections.OrderedDict[tuple[Hashable, int], tuple[float, BaseException]]
        self._errors = collections.OrderedDict()

    def remember(self, key: Hashable, token: int, error: BaseException, seconds: float) -> None:
        now = time.monotonic()
        with self._lock:
            errors = self._errors
            errors[key, token] = (now + seconds, error)
            errors.move_to_end((key, token))
            self._sweep(now)
            while len(errors) > self._limit:  # the oldest remembered first
                errors.popitem(last=False)

    def cause(self, key: Hashable, token: int) -> BaseException | None:
        now = time.monotonic()
        with self._lock:
            held = self._errors.get((key, token))
            if held is not None and held[0] <= now:
                self._sweep(now)
                return None
        return None if held is None else held[1]

    def _sweep(self, now: float) -> None:
        """(Under the lock) drop every expired error: times differ (a kept failure's
        keep time), so one kept long must not hold the short ones behind it."""
        errors = self._errors
        for gone in [entry for entry, (until, _) in errors.items() if until <= now]:
            del errors[gone]
