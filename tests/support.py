"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any


def run(coro: Coroutine[Any, Any, Any], timeout: float = 20.0) -> Any:
    """asyncio.run with a bound, so a lost wake-up fails instead of hanging."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


class LoopThread:
    """An event loop running in a thread of its own, for cross-loop tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Schedule ``coro`` on this loop; returns a concurrent.futures.Future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


async def until(predicate: Callable[[], bool], what: str = "condition") -> None:
    """Yield to the loop until ``predicate()`` holds (bounded by the test's own timeout).

    Used only to wait for state that other tasks/threads are driving towards;
    the interleaving itself is forced by events.
    """
    for _ in range(200_000):
        if predicate():
            return
        await asyncio.sleep(0 if _ % 100 else 0.001)
    raise AssertionError(f"timed out waiting for {what}")


def wait_until(predicate: Callable[[], bool], what: str = "condition") -> None:
    """The thread twin of :func:`until`."""
    event = threading.Event()
    for _ in range(20_000):
        if predicate():
            return
        event.wait(0.001)
    raise AssertionError(f"timed out waiting for {what}")


def work_until(started: threading.Event, release: threading.Event, value: Any) -> Any:
    """A leader's work: says it started, returns ``value`` once released."""

    def work() -> Any:
        started.set()
        assert release.wait(10)
        return value

    return work


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on a thread; the dict gets "result" or "error" when it ends."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["result"] = fn(*args, **kwargs)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


async def held_lead(group: Any, key: str) -> tuple[asyncio.Task[Any], asyncio.Event]:
    """Start ``group.run(key, ...)`` on this loop and return once its work runs; the work
    returns "old" when the event is set."""
    go, started = asyncio.Event(), asyncio.Event()

    async def work() -> str:
        started.set()
        await go.wait()
        return "old"

    task = asyncio.create_task(group.run(key, work))
    await started.wait()
    return task, go


def raised(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Exception | None:
    """The exception ``fn(*args, **kwargs)`` raised here, or None if it returned."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return exc
    return None


def outcome(box: dict[str, Any]) -> Any:
    """What a thread of ``in_thread`` ended with: its result, or its error."""
    return box["result"] if "result" in box else box.get("error")


def mypy_strict(
    tmp_path: Path, source: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` on ``source`` (dedented) as ``sample.py`` in ``tmp_path``."""
    sample = tmp_path / "sample.py"
    sample.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(sample)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


LONE = "tenant:\udcff"  # a lone surrogate: what a non-UTF-8 argv byte becomes in Python


# -- what a test observes of a group that FlightGroup does not show -------------------------
#
# The public face of a group counts (``stats()``) but names no flight: it does not say
# which flight holds a key, in which state it is, or which callers wait on it. A test that
# forces an interleaving by such a state, or pins that nothing is left of a flight that
# the counters do not count (an IDLE flight that waits for its first leader is not
# ``in_flight``), reads it through these helpers, and only through them.


def flight_of(group: Any, key: str) -> Any:
    """The flight ``group``'s table holds for ``key`` now (a ``run``/``run_sync`` key),
    or None. No public way: ``stats()`` counts flights, it names none."""
    return table_of(group).flights.get(key)


def flights_of(group: Any) -> list[Any]:
    """Every flight ``group``'s table holds now: those keyed, and those forget() detached
    that still run (read under the table's lock). No public way: ``stats().in_flight``
    leaves out an IDLE flight, which has no leader yet."""
    table = table_of(group)
    with table.lock:
        return [*table.flights.values(), *table.detached]


def waiting_on(group: Any, key: str) -> int:
    """How many callers wait on ``key``'s flight in ``group`` now (its leader's own wait
    included), 0 if there is none. No public way: ``stats().joins`` counts the joins
    made, and a joiner that withdrew stays counted there."""
    table = table_of(group)
    with table.lock:
        flight = table.flights.get(key)
        if flight is None:
            return 0
        return len(flight.waiters) + (flight.leading is not None)


def use_clock(group: Any, clock: Callable[[], float]) -> None:
    """Drive ``group``'s retention with ``clock`` (a fake one the test advances). No public
    way: a group reads time.monotonic, and a test cannot wait out a TTL by the clock."""
    table_of(group).use_clock(clock)


def kept_entries(group: Any) -> list[Any]:
    """The outcomes ``group`` keeps now (Retention), each with its ``ok`` and ``expires``
    (read under the table's lock). No public way: ``stats().kept`` counts them, and when
    each expires is not shown."""
    table = table_of(group)
    with table.lock:
        return [] if table.kept is None else list(table.kept._entries.values())


def waits_for_loss(lease: Any) -> int:
    """How many ``wait_lost()`` calls wait on ``lease`` now. No public way: a Lease says
    whether it is lost, not who waits for that."""
    waiters = lease._waiters
    return 0 if waiters is None else len(waiters)


def refused_by_an_outage(error: BaseException | None) -> bool:
    """True for the UnavailableError a call gets at once while its scope is known out of
    reach (the fleet's breaker is open; no directory coordinator answered)."""
    from flightgroup import UnavailableError

    return isinstance(error, UnavailableError) and (
        "out of reach for" in str(error) or "has answered for" in str(error)
    )


def once_reachable(
    call: Callable[[], Any], refused: list[BaseException] | None = None
) -> Any:
    """``call()`` once its group hears its scope again: until then each try is refused
    at once (and runs no work; ``refused`` gets each refusal)."""
    from flightgroup import UnavailableError

    while True:
        try:
            return call()
        except UnavailableError as exc:
            if not refused_by_an_outage(exc):
                raise
            if refused is not None:
                refused.append(exc)
            time.sleep(0.02)


def hanging_works(ran: list[str], release: threading.Event) -> Callable[[str], Any]:
    """``hangs(key)``: a sync work that notes ``key`` in ``ran`` and blocks until
    ``release`` is set (at most 20 s): a work left running past its deadline."""

    def hangs(key: str) -> Callable[[], None]:
        def work() -> None:
            ran.append(key)
            release.wait(20)

        return work

    return hangs


# -- the parts of a group that white-box tests patch or read ---------------------------------
#
# A test that forces an interleaving inside a real wide scope patches a step of that scope
# (or of the bridge to it) for one group only, and tells "its" object apart by these; a
# test of a scope's own bookkeeping reads it through them. The group's fields are named
# here and nowhere else in the tests.


def scope_of(group: Any) -> Any:
    """``group``'s wide scope (its arbiter), None in the process scope: what the CLI's
    ``status`` reads (``internals(group).scope``)."""
    from flightgroup.group import internals

    return internals(group).scope


def table_of(group: Any) -> Any:
    """``group``'s flight table (``internals(group).table``)."""
    from flightgroup.group import internals

    return internals(group).table


def bridge_of(group: Any) -> Any:
    """The bridge between ``group``'s table and its wide scope (None in the process
    scope). No public way: what a wide flight adds is the bridge's own."""
    return group._bridge
