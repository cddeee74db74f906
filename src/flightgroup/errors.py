"""Every public error of flightgroup.

All of them derive from :class:`FlightError`; the only exceptions a call raises
that do not are the builtin :class:`TimeoutError` (the caller's own ``timeout``),
:class:`asyncio.CancelledError` (the caller's own cancellation) and the user's own
exceptions (a leader gets its work's exception itself).

Each error keeps its constructor arguments so that it pickles and can cross a
process boundary in the wider scopes.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FlightError",
    "FlightFailedError",
    "FlightInterruptedError",
    "FlightTimeoutError",
    "GroupClosedError",
    "LeaseLostError",
    "NetworkDirectoryError",
    "ProtocolVersionError",
    "TooManyFlightsError",
    "TooManyWaitersError",
    "UnavailableError",
    "ValueTooLargeError",
]


class FlightError(Exception):
    """The base class of every flightgroup error."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._init_args())

    def _init_args(self) -> tuple[Any, ...]:
        return self.args


class FlightFailedError(FlightError):
    """A joiner's view of a flight whose work raised.

    ``error_type`` is the failed exception class's ``__qualname__`` (e.g.
    ``"ValueError"``), ``error_module`` its ``__module__``, ``message`` its
    ``str()``. In the leader's process ``__cause__`` is the original exception;
    each joiner gets its own instance, so the original's traceback never grows.
    """

    def __init__(self, key: str, error_type: str, message: str, error_module: str = "builtins"):
        self.key = key
        self.error_type = error_type
        self.error_module = error_module
        self.message = message
        super().__init__(f"The flight of {key!r} failed: {error_type}: {message}")

    def _init_args(self) -> tuple[Any, ...]:
        return (self.key, self.error_type, self.message, self.error_module)

    @staticmethod
    def describe(key: str, error: BaseException) -> tuple[str, str, str, str]:
        """(error_type, error_module, message, text): what every joiner's error says.
        Made once per flight, however many joiners it has."""
        kind = type(error)
        try:
            message = str(error)
        except Exception:  # a __str__ that raises must not stop the flight's landing
            message = "<exception str() failed>"  # as the traceback module says it
        return (
            kind.__qualname__,
            kind.__module__,
            message,
            f"The flight of {key!r} failed: {kind.__qualname__}: {message}",
        )

    @classmethod
    def of(
        cls,
        key: str,
        error: BaseException,
        description: tuple[str, str, str, str] | None = None,
    ) -> FlightFailedError:
        """A new error for one joiner; ``__cause__`` is ``error`` itself."""
        error_type, error_module, message, text = description or cls.describe(key, error)
        failed = cls.__new__(cls, text)  # BaseException.__new__ sets args=(text,)
        failed.key = key
        failed.error_type = error_type
        failed.error_module = error_module
        failed.message = message
        failed.__cause__ = error
        return failed


class FlightInterruptedError(FlightError):
    """The flight ended without an outcome: its leader died, lost its lease, or its
    work was stopped by a BaseException (KeyboardInterrupt, a loop shutting down).
    A joiner that gets it never ran the work; the next call leads a new flight."""

    def __init__(self, key: str, reason: str = "its leader stopped before it landed"):
        self.key = key
        self.reason = reason
        super().__init__(f"The flight of {key!r} was interrupted: {reason}.")

    def _init_args(self) -> tuple[Any, ...]:
        return (self.key, self.reason)


class FlightTimeoutError(FlightError):
    """The work of the flight ran past its ``deadline`` (after its retries).

    ``attempts``: how many attempts the flight made, retries included (None where it is
    not known: a joiner in another process of a fleet group). ``max_deadline_threads``: set
    when the last attempt (a sync work's) never ran because the group's threads for sync
    works under a deadline were all busy, in time or left past their deadlines, for all
    of its deadline (ADR 0038); else None.
    """

    def __init__(
        self,
        key: str,
        deadline: float,
        attempts: int | None = None,
        max_deadline_threads: int | None = None,
    ):
        self.key = key
        self.deadline = deadline
        self.attempts = attempts
        self.max_deadline_threads = max_deadline_threads
        text = f"The flight of {key!r} ran past its deadline of {deadline:g} s"
        if attempts is not None:
            text += f" ({attempts} attempt{'' if attempts == 1 else 's'})"
        if max_deadline_threads is not None:
            text += (
                f"; the last never ran: all {max_deadline_threads} threads this group runs "
                "sync works under a deadline on (its max_deadline_threads) stayed busy, "
                "in time or left past their deadlines"
            )
        super().__init__(text + ".")

    def _init_args(self) -> tuple[Any, ...]:
        return (self.key, self.deadline, self.attempts, self.max_deadline_threads)


class LeaseLostError(FlightError):
    """The leader lost the lease of its flight; what it lands is refused."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(f"The lease of the flight of {key!r} was lost.")

    def _init_args(self) -> tuple[Any, ...]:
        return (self.key,)


class TooManyWaitersError(FlightError):
    """The flight already has ``limit`` callers waiting on it in this process (its
    joiners, and fresh callers waiting for its end to share the next flight)."""

    def __init__(self, key: str, limit: int):
        self.key = key
        self.limit = limit
        super().__init__(
            f"The flight of {key!r} already has {limit} callers waiting "
            "(joiners and fresh callers)."
        )

    def _init_args(self) -> tuple[Any, ...]:
        return (self.key, self.limit)


class TooManyFlightsError(FlightError):
    """This process already leads or waits for ``limit`` flights and the key is new."""

    def __init__(self, key: str, limit: int):
        self.key = key
        self.limit = limit
        super().__init__(f"Cannot start a flight of {key!r}: {limit} flights are in progress.")

    def _init_args(self) -> tuple[Any, ...]:
        return (self.key, self.limit)


class ValueTooLargeError(FlightError):
    """The encoded outcome is ``size`` bytes, over the group's ``limit``."""

    def __init__(self, key: str, size: int, limit: int):
        self.key = key
        self.size = size
        self.limit = limit
        super().__init__(
            f"The outcome of {key!r} is {size} bytes encoded, over the limit of {limit} bytes."
        )

    def _init_args(self) -> tuple[Any, ...]:
        return (self.key, self.size, self.limit)


class ProtocolVersionError(FlightError):
    """The coordinator speaks protocol version ``theirs``; this process speaks ``ours``."""

    def __init__(self, ours: int, theirs: int | None):
        self.ours = ours
        self.theirs = theirs
        super().__init__(
            f"The coordinator speaks flightgroup protocol version {theirs}; this process "
            f"speaks version {ours}."
        )

    def _init_args(self) -> tuple[Any, ...]:
        return (self.ours, self.theirs)


class NetworkDirectoryError(FlightError):
    """The group's directory is on a network file system, where kernel locks and
    Unix sockets do not work across hosts."""

    def __init__(self, directory: str, file_system: str):
        self.directory = directory
        self.file_system = file_system
        super().__init__(
            f"The directory {directory!r} is on a network file system ({file_system}); "
            "a directory group needs a local directory."
        )

    def _init_args(self) -> tuple[Any, ...]:
        return (self.directory, self.file_system)


class GroupClosedError(FlightError):
    """The group is closed: every call is rejected."""

    def __init__(self, message: str = "This flight group is closed."):
        super().__init__(message)


class UnavailableError(FlightError):
    """The group's scope cannot be reached (Redis, or a directory's coordinator);
    ``__cause__`` is the client's own error where there is one. ``key``: the key of
    the call that raised it (None where no call of a key did)."""

    def __init__(self, message: str, key: str | None = None):
        self.key = key
        super().__init__(message)

    def _init_args(self) -> tuple[Any, ...]:
        return (*self.args, self.key)


def renewed(error: BaseException) -> BaseException:
    """A new instance of a flightgroup ``error`` for one caller (raising one shared
    instance from many callers would grow its traceback); other errors as they are."""
    if not isinstance(error, FlightError):
        return error
    try:
        made = type(error)(*error._init_args())
    except Exception:
        return error
    made.__cause__ = error.__cause__
    notes = getattr(error, "__notes__", None)
    if notes:
        made.__notes__ = list(notes)
    return made
