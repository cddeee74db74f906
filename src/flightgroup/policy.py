"""Flight policies: Retry, Retention, Limits (frozen, validated at construction).

A policy belongs to the flight, never to a caller: the first caller's policy
(the leader's) is the flight's policy, and later callers never change it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .codec import Codec

__all__ = [
    "NO_POLICY",
    "ON_UNAVAILABLE",
    "FlightPolicy",
    "Limits",
    "OnUnavailable",
    "Retention",
    "Retry",
    "check_on_unavailable",
    "check_seconds",
    "check_takeover",
]

OnUnavailable = Literal["raise", "local"]
ON_UNAVAILABLE: tuple[OnUnavailable, ...] = ("raise", "local")


def check_on_unavailable(value: object, *, allow_none: bool = True) -> OnUnavailable | None:
    """Validate ``on_unavailable`` ("raise" or "local"; None: not given, where allowed)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise TypeError(f"on_unavailable must be 'raise' or 'local', not {type(value).__name__}")
    if value == "raise":
        return "raise"
    if value == "local":
        return "local"
    raise ValueError(f"on_unavailable must be 'raise' or 'local', not {value!r}")


def check_takeover(value: object, *, allow_none: bool = True) -> int | None:
    """Validate ``takeover`` (an int >= 0; None: not given, where allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"takeover must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"takeover must be 0 or more, not {value}")
    return value


def check_seconds(name: str, value: object, *, allow_none: bool = True, allow_zero: bool = True,
                  allow_inf: bool = True) -> float | None:
    """Validate a duration in seconds; return it as a float (or None).

    Raises TypeError for a non-number (bools included) and ValueError for NaN, a
    negative number, or a value the caller does not allow, naming ``name``.
    """
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds):
        raise ValueError(f"{name} must not be NaN")
    if seconds < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    if seconds == 0 and not allow_zero:
        raise ValueError(f"{name} must be greater than 0, got {value!r}")
    if math.isinf(seconds) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {value!r}")
    return seconds


def _check_count(name: str, value: object, *, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Retry:
    """Retries of a flight's work. ``attempts`` counts the first run.

    Backoff before attempt n+1 is ``min(max_backoff, backoff * 2**(n-1))``, drawn
    uniformly from [0, that] when ``jitter`` (full jitter). Only exceptions that
    are instances of ``on`` retry; a deadline overrun retries only when
    ``on_timeout``.
    """

    attempts: int = 3
    backoff: float = 0.1
    max_backoff: float = 5.0
    jitter: bool = True
    on: tuple[type[BaseException], ...] = (Exception,)
    on_timeout: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"Retry.attempts must be an int, not {type(self.attempts).__name__}")
        if self.attempts < 1:
            raise ValueError(f"Retry.attempts must be at least 1, got {self.attempts}")
        check_seconds("Retry.backoff", self.backoff, allow_none=False, allow_inf=False)
        check_seconds("Retry.max_backoff", self.max_backoff, allow_none=False, allow_inf=False)
        for name in ("jitter", "on_timeout"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Retry.{name} must be a bool")
        on = self.on
        if isinstance(on, type):
            on = (on,)
            object.__setattr__(self, "on", on)
        if not isinstance(on, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in on
        ):
            raise TypeError("Retry.on must be a tuple of exception classes")


@dataclass(frozen=True, slots=True)
class Retention:
    """Keeping a settled outcome for later calls. ``success`` / ``error`` are
    seconds to keep a value / a failure (None: not kept). The store is bounded by
    ``max_items`` (LRU) and then by ``max_bytes`` of encoded size."""

    success: float | None = 30.0
    error: float | None = None
    max_items: int = 10_000
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        check_seconds("Retention.success", self.success, allow_inf=False)
        check_seconds("Retention.error", self.error, allow_inf=False)
        if self.max_items is None:
            raise TypeError("Retention.max_items must be an int, not None")
        _check_count("Retention.max_items", self.max_items, minimum=1)
        _check_count("Retention.max_bytes", self.max_bytes, minimum=1)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-process bounds: ``max_waiters`` callers waiting on one flight here (its
    joiners, and its ``fresh=True`` callers waiting for its end), ``max_flights``
    flights this process leads or waits for."""

    max_waiters: int | None = None
    max_flights: int | None = None

    def __post_init__(self) -> None:
        _check_count("Limits.max_waiters", self.max_waiters, minimum=0)
        _check_count("Limits.max_flights", self.max_flights, minimum=1)


@dataclass(frozen=True, slots=True)
class FlightPolicy:
    """Everything a flight runs by: the group's settings, or an operation's overrides.
    A flight takes its leader's policy when it starts and keeps it to its end."""

    deadline: float | None = None
    retry: Retry | None = None
    retention: Retention | None = None
    limits: Limits | None = None
    # What a call does while its wide scope cannot be reached: raise UnavailableError,
    # or coalesce within this process alone (docs/failures.md).
    on_unavailable: OnUnavailable = "raise"
    # How many times a caller whose flight ended interrupted (its leader died, lost its
    # lease, was stopped) calls again instead of raising FlightInterruptedError: the
    # first of them leads the key's next flight, the others join it (0: never).
    takeover: int = 0
    # What turns the flight's value into bytes for the other callers and back: the
    # group's, or the operation's own (None: values are shared as they are). The
    # flight's leader encodes with it and every caller here decodes with it.
    codec: Codec | None = None
    keeps: bool = field(init=False, repr=False, compare=False)
    """True if a settled outcome may be kept (read on every settle)."""

    def __post_init__(self) -> None:
        retention = self.retention
        keeps = retention is not None and bool(retention.success or retention.error)
        object.__setattr__(self, "keeps", keeps)

    def override(
        self,
        deadline: float | None,
        retry: Retry | None,
        retention: Retention | None,
        limits: Limits | None,
        on_unavailable: OnUnavailable | None = None,
        takeover: int | None = None,
        codec: Codec | None = None,
    ) -> FlightPolicy:
        """This policy with each given (not None) field replaced."""
        return FlightPolicy(
            deadline if deadline is not None else self.deadline,
            retry if retry is not None else self.retry,
            retention if retention is not None else self.retention,
            limits if limits is not None else self.limits,
            on_unavailable if on_unavailable is not None else self.on_unavailable,
            takeover if takeover is not None else self.takeover,
            codec if codec is not None else self.codec,
        )

    def with_codec(self, codec: Codec | None) -> FlightPolicy:
        """This policy with ``codec`` (itself when that is its codec already)."""
        if codec is self.codec:
            return self
        return FlightPolicy(
            self.deadline, self.retry, self.retention, self.limits, self.on_unavailable,
            self.takeover, codec,
        )

    def backoff(self, failed_attempts: int, uniform: Callable[[float, float], float]) -> float:
        """Seconds to wait before the next attempt: exponential, capped, full jitter."""
        retry = self.retry
        assert retry is not None
        # The exponent stops growing at 64: past 1024 the float would overflow (and a
        # pause of 2**64 backoffs is past any max_backoff anyway).
        cap = min(retry.max_backoff, retry.backoff * 2.0 ** min(failed_attempts - 1, 64))
        return uniform(0.0, cap) if retry.jitter else cap

    def retries(self, attempt: int, error: BaseException, timed_out: bool) -> bool:
        """True if the attempt numbered ``attempt`` (from 1) that ended with ``error``
        is followed by another."""
        retry = self.retry
        if retry is None or attempt >= retry.attempts:
            return False
        if timed_out:
            return retry.on_timeout
        return isinstance(error, retry.on)


NO_POLICY = FlightPolicy()
