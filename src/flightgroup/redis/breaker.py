"""Whether a fleet group knows Redis out of reach now, and the probe that finds it back.

The first error that says Redis cannot be reached (a refused or broken connection, an
unanswered command) opens the breaker: from then on a new call raises UnavailableError
at once, in its caller's thread, without a round trip (``refusal``). One probe task on
the group's loop sends PING every ``PROBE_EVERY`` seconds, each bounded by the command
timeout; the first answer closes the breaker, so new calls go through Redis again
within about ``PROBE_EVERY`` (plus one command timeout for a server that was frozen).
Only the probe pays the timeouts of an outage.

What the breaker never does: refuse a step of a flight already under way (a lead's
renewal, a landing, a joiner's read, an undo): each of those has its own bound. And it
never lets a call skip the undo of a ghost flight (ADR 0024): the undo tasks wait on
``reachable`` between tries, so they run again the moment the probe is answered, and
a key's next ACQUIRE waits for its undo as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._log import log
from ..errors import UnavailableError

if TYPE_CHECKING:
    from .arbiter import RedisArbiter

__all__ = ["PROBE_EVERY", "Breaker", "out_of_reach"]

PROBE_EVERY = 0.2  # seconds between two PINGs of the probe while the breaker is open

# What says "Redis cannot be reached" (a ResponseError does not: Redis answered).
# redis-py's ConnectionError covers refused, reset and closed connections and a server
# still loading; its TimeoutError an unanswered command; OSError what the socket itself
# raised; a Cluster client raises RedisClusterException when no node answers.
_OUT_OF_REACH = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    RedisClusterException,
    TimeoutError,
)


def out_of_reach(exc: BaseException) -> bool:
    """True when ``exc`` says Redis could not be reached (not that it refused a step)."""
    return isinstance(exc, _OUT_OF_REACH)


class Breaker:
    """Open while Redis is known out of reach (see the module). ``opened`` and the
    error are written on the group's loop and read from any thread: a caller that
    reads a stale value either pays one more round trip or is refused by an outage
    that ended within the last probe interval."""

    __slots__ = ("_arbiter", "_probe", "error", "opened", "reachable")

    def __init__(self, arbiter: RedisArbiter) -> None:
        self._arbiter = arbiter
        self.error: BaseException | None = None  # the error that opened it; None: closed
        self.opened = 0.0  # time.monotonic() when it opened
        self._probe: asyncio.Task[None] | None = None
        # Set while closed: what waits for Redis to answer again waits on it (on the loop).
        self.reachable = asyncio.Event()
        self.reachable.set()

    def refusal(self) -> UnavailableError | None:
        """(Any thread) the error a new call raises now, or None while closed."""
        error = self.error
        if error is None:
            return None
        refused = UnavailableError(
            f"Redis at {self._arbiter._where()} has been out of reach for "
            f"{time.monotonic() - self.opened:.1f} s (probed every {PROBE_EVERY:g} s): "
            f"{error}"
        )
        refused.__cause__ = error
        return refused

    def saw(self, exc: BaseException) -> None:
        """(On the loop) a step failed with ``exc``: open if it says Redis is out of
        reach, and start the probe."""
        if not out_of_reach(exc) or self._arbiter._closing:
            return
        if self.error is None:
            self.opened = time.monotonic()
            log.info(
                "Redis at %s is out of reach (%s): new calls raise "
                "UnavailableError until it answers again",
                self._arbiter._where(),
                exc,
            )
            self.reachable.clear()
        self.error = exc
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._run())

    def answered(self) -> None:
        """(On the loop) Redis answered a step: close."""
        if self.error is None:
            return
        log.info(
            "Redis at %s answers again after %.1f s",
            self._arbiter._where(),
            time.monotonic() - self.opened,
        )
        self.error = None
        self.reachable.set()

    async def wait_reachable(self, timeout: float) -> None:
        """(On the loop) return once the breaker is closed, or after ``timeout`` s."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.reachable.wait(), timeout)

    async def _run(self) -> None:
        arbiter = self._arbiter
        while self.error is not None and not arbiter._closing:
            await asyncio.sleep(PROBE_EVERY)
            try:
                await asyncio.wait_for(_ping(arbiter), arbiter._timeout)
            except Exception as exc:
                if out_of_reach(exc):
                    # (A call's answer may have closed it while this PING was out: then
                    # this is a new outage, opened as a call would open it.)
                    self.saw(exc)
                    continue
                # Any other error (a ResponseError, NOAUTH): Redis answered.
            self.answered()

    def stop(self) -> None:
        """(On the loop, closing) end the probe."""
        if self._probe is not None:
            self._probe.cancel()


async def _ping(arbiter: RedisArbiter) -> Any:
    # The blocking client never re-sends: one PING is one try, bounded by the caller.
    return await arbiter._blocking.ping()
