"""A wide scope out of reach: how long a call takes to fail, and how soon calls go
through the scope again once it is back (the fleet section's measurement (5), the
directory section's (6)).

The fleet: a ``redis-server`` of the measurement's own (``fleet.RedisServer``, a free loopback
port) serves a ``FlightGroup(redis=URL, namespace="outage", codec=JSON)`` (default lease)
in the benchmark's own process for one call, then is SIGKILLed by its pid. Each call
then times ``g.run_sync(key, work)`` in the caller's thread (``time.perf_counter``),
the work never runs: the first call (the one that finds the outage), then ``calls``
sequential calls of one key, then ``calls`` of distinct keys. Beside it, the same on a
group whose breaker never refuses (``Breaker.refusal`` returns None: each call sends its
own ACQUIRE, pays redis-py's tries, and a key's next call waits for the undo of the
last one's, as before the breaker), with ``unguarded`` calls per series since each costs
up to a command timeout. "Back within": the server is started again on the same port;
from its first PONG to the benchmark (polled every ``POLL`` s) until a call of the
group leads through Redis (tried every ``POLL`` s); ``returns`` times, the server
SIGKILLed and the outage found by a call again between two.

The directory: in a fresh directory the benchmark holds ``flight.lock`` and listens on
``flight.sock`` without ever accepting (a frozen coordinator: connections queue, no
handshake is answered); a ``FlightGroup(directory=d, codec=JSON, reconnect_timeout=0.3)``
in the benchmark's process times its first call (it waits through reconnect_timeout),
then ``calls`` calls of one key and ``calls`` of distinct keys. "Back within": the
benchmark closes its socket, removes ``flight.sock`` and lets go of ``flight.lock``; from
then until a call of the group leads (tried every ``POLL`` s): the group's own process
wins the election and serves. ``tries`` times, each in a fresh directory with a fresh
group (the calls of one key and of distinct keys in the first only).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .scenarios import quiet

if TYPE_CHECKING:
    from .fleet import RedisServer
    from .report import Target

__all__ = [
    "BACK_GOAL",
    "REFUSED_GOAL",
    "Calls",
    "DirOutage",
    "Outage",
    "directory_lines",
    "directory_targets",
    "lines",
    "measure",
    "measure_directory",
    "ok",
    "targets",
]

REFUSED_GOAL = 0.010  # s: the p99 of a call refused while Redis is known down
BACK_GOAL = 1.0  # s: from Redis answering again to a call led through it
POLL = 0.002  # s between two tries (the server's PING, a call) when timing "back within"
NAMESPACE = "outage"
GUARDED = "flightgroup (the breaker)"
UNGUARDED = "flightgroup with the breaker disabled (each call tries Redis)"


@dataclass
class Calls:
    """One group's calls while Redis is down: seconds per call, and what they raised."""

    first: list[float] = field(default_factory=list)  # the calls that found an outage
    one_key: list[float] = field(default_factory=list)
    distinct: list[float] = field(default_factory=list)
    unavailable: int = 0  # calls (the first ones too) that raised UnavailableError
    at_once: int = 0  # of the later ones, refused at once (their text holds ``refused_as``)
    refused_as: str = "out of reach for"  # the fleet breaker's text
    other: str = ""  # the first outcome that was not UnavailableError

    @property
    def made(self) -> int:
        return len(self.first) + len(self.one_key) + len(self.distinct)

    @property
    def later(self) -> list[float]:
        """Every call after the first of an outage."""
        return [*self.one_key, *self.distinct]


@dataclass
class Outage:
    calls: int = 0  # per series of the guarded group
    unguarded: int = 0  # per series of the unguarded one
    guarded: Calls = field(default_factory=Calls)
    open: Calls = field(default_factory=Calls)  # the breaker disabled
    back: list[float] = field(default_factory=list)  # s, Redis back -> a call led
    measured: bool = False


def _never() -> str:
    raise AssertionError("the work ran while Redis was down")


def _timed(group: Any, key: str, into: list[float], calls: Calls) -> None:
    """One call of ``key`` while Redis is down: its time into ``into``, its outcome
    into ``calls``."""
    from flightgroup import UnavailableError

    start = time.perf_counter()
    try:
        group.run_sync(key, _never, timeout=30.0)
    except UnavailableError as exc:
        into.append(time.perf_counter() - start)
        calls.unavailable += 1
        # (The first call of an outage may find the breaker open already: a step of the
        # group's own, a probe's PING or an undo, heard the outage before it.)
        calls.at_once += into is not calls.first and calls.refused_as in str(exc)
        return
    except Exception as exc:
        into.append(time.perf_counter() - start)
        calls.other = calls.other or f"{type(exc).__name__}: {exc}"
        return
    into.append(time.perf_counter() - start)
    calls.other = calls.other or "a call returned"


def _series(group: Any, calls: Calls, count: int, tag: str) -> None:
    """The first call of the outage, ``count`` of one key, ``count`` of distinct keys."""
    with quiet():
        _timed(group, f"{tag}:first", calls.first, calls)
        for _ in range(count):
            _timed(group, f"{tag}:one", calls.one_key, calls)
        for i in range(count):
            _timed(group, f"{tag}:key{i}", calls.distinct, calls)


def _back_within(group: Any, server: RedisServer, tag: str) -> float:
    """Start the server again: seconds from its first PONG until a call of ``group``
    leads through it (the calls before are refused)."""
    from flightgroup import UnavailableError

    answered = server.start(POLL)
    deadline = time.monotonic() + 30
    while True:
        try:
            result = group.run_sync(tag, lambda: "back", timeout=30.0)
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL)
            continue
        led = time.monotonic_ns()
        if result.value != "back" or result.joined:
            raise RuntimeError(f"the call after the outage got {result!r}")
        return (led - answered) / 1e9


def measure(binary: str, *, calls: int, unguarded: int, returns: int, out: Outage) -> None:
    """Run the measurement (see the module) on a server of its own into ``out``."""
    from flightgroup import JSON, FlightGroup
    from flightgroup.redis.breaker import Breaker

    from .fleet import RedisServer

    class NeverRefuses(Breaker):
        """The breaker disabled: it opens and probes, but never refuses a call."""

        __slots__ = ()

        def refusal(self) -> None:
            return None

    out.calls, out.unguarded = calls, unguarded
    server = RedisServer(binary)
    groups: list[Any] = []
    try:
        guarded = FlightGroup(redis=server.url, namespace=NAMESPACE, codec=JSON)
        groups.append(guarded)
        guarded.run_sync("warm-up", lambda: 1, timeout=30.0)
        server.kill()
        _series(guarded, out.guarded, calls, "guarded")
        for i in range(returns):
            out.back.append(_back_within(guarded, server, f"back:{i}"))
            server.kill()
            if i < returns - 1:  # the next return needs the outage found again
                _timed(guarded, f"guarded:first{i}", out.guarded.first, out.guarded)
        server.start()
        plain = FlightGroup(redis=server.url, namespace=NAMESPACE, codec=JSON)
        groups.append(plain)
        arbiter: Any = plain._scope  # the RedisArbiter of a fleet group
        arbiter._breaker = NeverRefuses(arbiter)
        plain.run_sync("warm-up-open", lambda: 1, timeout=30.0)
        server.kill()
        _series(plain, out.open, unguarded, "open")
        server.start()  # the groups' undos are answered: closing waits for nothing
        out.measured = True
    finally:
        for group in groups:
            group.close()
        server.close()


@dataclass
class DirOutage:
    calls: int = 0  # per series
    reconnect_timeout: float = 0.0
    refused: Calls = field(default_factory=lambda: Calls(refused_as="has answered for"))
    back: list[float] = field(default_factory=list)  # s, coordinator free -> a call led
    measured: bool = False


def _back_when_free(group: Any, lock: int, listener: socket.socket, path: str) -> float:
    """End the frozen coordinator (its socket, its file, the election): seconds from
    then until a call of ``group`` leads."""
    from flightgroup import UnavailableError

    listener.close()
    os.unlink(path)
    freed = time.perf_counter()
    os.close(lock)  # the election is free: the group's own campaign wins it
    deadline = time.monotonic() + 30
    while True:
        try:
            result = group.run_sync("back", lambda: "back", timeout=30.0)
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL)
            continue
        led = time.perf_counter()
        if result.value != "back" or result.joined:
            raise RuntimeError(f"the call after the outage got {result!r}")
        return led - freed


def measure_directory(
    tempdir: Callable[[], str],
    *,
    calls: int,
    tries: int,
    reconnect_timeout: float,
    out: DirOutage,
) -> None:
    """Run the directory's measurement (see the module) into ``out``."""
    import fcntl

    from flightgroup import JSON, FlightGroup

    out.calls, out.reconnect_timeout = calls, reconnect_timeout
    for i in range(tries):
        directory = tempdir()
        lock = os.open(os.path.join(directory, "flight.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        group: Any = None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the frozen one holds it
            path = os.path.join(directory, "flight.sock")
            listener.bind(path)
            listener.listen(64)  # connections queue; nobody accepts or answers them
            group = FlightGroup(
                directory=directory, codec=JSON, reconnect_timeout=reconnect_timeout
            )
            with quiet():
                _timed(group, f"first:{i}", out.refused.first, out.refused)
                if i == 0:
                    for _ in range(calls):
                        _timed(group, "one", out.refused.one_key, out.refused)
                    for k in range(calls):
                        _timed(group, f"key{k}", out.refused.distinct, out.refused)
            out.back.append(_back_when_free(group, lock, listener, path))
            lock = -1
        finally:
            if group is not None:
                group.close()
            listener.close()
            if lock >= 0:
                os.close(lock)
    out.measured = True


# -----------------------------------------------------------------------------
# the report
# -----------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f}"


def _raised(calls: Calls) -> str:
    if calls.unavailable == calls.made:
        return "yes"
    return f"no ({calls.made - calls.unavailable} of {calls.made}: {calls.other})"


def ok(out: Outage) -> bool:
    """False if a call while Redis was down did anything but raise UnavailableError,
    or the guarded group waited on Redis after it knew it down."""
    if not out.measured:
        return True
    g = out.guarded
    return g.unavailable == g.made and g.at_once == len(g.later) and not out.open.other


def targets(out: Outage) -> list[Target]:
    from .report import Target

    if not out.measured:
        return []
    g, o = out.guarded, out.open
    later = g.later
    found = [
        Target(
            f"fleet (5): Redis down: every call raised UnavailableError; the calls after "
            f"the first ({len(later)}) refused at once by the breaker, without a round trip",
            f"{_raised(g)}; {g.at_once}",
            f"yes; {len(later)}",
            ok(out),
            True,
        ),
        Target(
            f"fleet (5): Redis down: a refused call, p99 of {out.calls} calls of one key and "
            f"{out.calls} of distinct keys",
            f"{_ms(_pct(later, 99))} ms (p50 {_ms(_pct(later, 50))} ms, max "
            f"{_ms(max(later))} ms; the first call, which finds the outage: "
            f"{_ms(max(g.first))} ms at worst of {len(g.first)})",
            f"≤ {REFUSED_GOAL * 1e3:,g} ms",
            _pct(later, 99) <= REFUSED_GOAL,
        ),
    ]
    if o.later:
        found.append(
            Target(
                f"fleet (5): Redis down, median per call: the breaker disabled ÷ the breaker "
                f"({out.unguarded} + {out.unguarded} calls disabled, {out.calls} + {out.calls} "
                "with the breaker)",
                f"{_pct(o.later, 50) / _pct(later, 50):,.0f}×",
                "information",
                None,
            )
        )
    if out.back:
        found.append(
            Target(
                f"fleet (5): Redis back (its first PONG) → a call led through it, worst of "
                f"{len(out.back)}",
                f"{_ms(max(out.back))} ms",
                f"< {BACK_GOAL * 1e3:,g} ms",
                max(out.back) < BACK_GOAL,
            )
        )
    return found


def lines(out: Outage) -> list[str]:
    """The section's "(5)" text and tables."""
    from flightgroup.redis.breaker import PROBE_EVERY

    if not out.measured:
        return []
    rows = [
        (GUARDED, out.guarded, out.calls),
        (UNGUARDED, out.open, out.unguarded),
    ]
    base = _pct(out.guarded.later, 50) if out.guarded.later else 0.0
    text = [
        "### (5) Calls while Redis is down, and once it is back",
        "",
        "A `redis-server` of this measurement's own, one "
        f'`FlightGroup(redis=URL, namespace="{NAMESPACE}", codec=JSON)` (default lease '
        "10 s, command timeout 2.5 s) in the benchmark's process that made one call, then "
        "the server SIGKILLed by its pid (connections refused at once). Each "
        "`g.run_sync(key, work)` is timed in the caller's thread, sequentially; the work "
        "never runs. The first call finds the outage (it sends an ACQUIRE, redis-py "
        "tries it again 3 times); then the calls of one key, then the calls of distinct "
        "keys. The breaker disabled is the same group whose breaker never refuses a call "
        "(`Breaker.refusal` returns None: each call sends its own ACQUIRE through "
        "redis-py's tries, and a key's next call first waits, at most a command timeout, "
        "for the undo of the ACQUIRE that got no answer, as before the breaker); it makes "
        f"{out.unguarded} calls per series, since each may cost a command timeout. Times "
        f"in ms; ratio: the row's p50 ÷ the breaker's.",
        "",
        "| group | series | calls | p50 | p99 | max | raised UnavailableError | "
        "p50 ÷ the breaker's |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, calls, _count in rows:
        for series, values in (
            ("the first call of the outage", calls.first),
            ("one key", calls.one_key),
            ("distinct keys", calls.distinct),
        ):
            if not values:
                continue
            compared = calls is out.open and values is not calls.first
            ratio = f"{_pct(values, 50) / base:,.0f}×" if base > 0 and compared else "—"
            text.append(
                f"| {name} | {series} | {len(values)} | {_ms(_pct(values, 50))} | "
                f"{_ms(_pct(values, 99))} | {_ms(max(values))} | {_raised(calls)} | {ratio} |"
            )
    if out.back:
        text += [
            "",
            f"Redis back: the server started again on the same port, {len(out.back)} "
            "times (SIGKILLed again and the outage found by a call between two); from its "
            f"first PONG to the benchmark (a PING every {POLL * 1e3:g} ms) until a call "
            f"(tried every {POLL * 1e3:g} ms, refused until then) led through it: "
            + ", ".join(f"{_ms(t)}" for t in out.back)
            + f" ms. Goal: < {BACK_GOAL * 1e3:,g} ms. The first step that hears Redis "
            f"closes the breaker: the probe (a PING every {PROBE_EVERY:g} s) or the undo "
            "of the ACQUIRE that found the outage (it tries again after 50 ms, then "
            "pauses that double up to 1 s); after outages this short, mostly the undo "
            f"(the probe alone bounds it by {PROBE_EVERY:g} s and a PING).",
        ]
    return [*text, ""]


def directory_ok(out: DirOutage) -> bool:
    """False if a call without a coordinator did anything but raise UnavailableError, or
    a call after the first waited for one again."""
    r = out.refused
    return not out.measured or (r.unavailable == r.made and r.at_once == len(r.later))


def directory_targets(out: DirOutage) -> list[Target]:
    from .report import Target

    if not out.measured:
        return []
    r = out.refused
    later = r.later
    return [
        Target(
            "directory (6): coordinator frozen: every call raised UnavailableError; the "
            f"calls after the first ({len(later)}) refused at once",
            f"{_raised(r)}; {r.at_once}",
            f"yes; {len(later)}",
            directory_ok(out),
            True,
        ),
        Target(
            f"directory (6): coordinator frozen: a refused call, p99 of {out.calls} calls of "
            f"one key and {out.calls} of distinct keys",
            f"{_ms(_pct(later, 99))} ms (p50 {_ms(_pct(later, 50))} ms, max "
            f"{_ms(max(later))} ms; the first call, until the group gives up with "
            f"reconnect_timeout={out.reconnect_timeout:g}: {_ms(max(r.first))} ms at worst "
            f"of {len(r.first)})",
            f"≤ {REFUSED_GOAL * 1e3:,g} ms",
            _pct(later, 99) <= REFUSED_GOAL,
        ),
        Target(
            "directory (6): the frozen coordinator gone → a call led (this process "
            f"elected), worst of {len(out.back)}",
            f"{_ms(max(out.back))} ms",
            f"< {BACK_GOAL * 1e3:,g} ms",
            max(out.back) < BACK_GOAL,
        ),
    ]


def directory_lines(out: DirOutage) -> list[str]:
    """The directory section's "(6)" text and table."""
    if not out.measured:
        return []
    r = out.refused
    rows = (
        ("the first call of the outage (until the group gives up: see above)", r.first),
        ("one key", r.one_key),
        ("distinct keys", r.distinct),
    )
    return [
        "### (6) Calls while the coordinator is frozen, and once it is gone",
        "",
        f"{len(out.back)} tries, each in a fresh directory where the benchmark holds "
        "`flight.lock` and listens on `flight.sock` without ever accepting (a frozen "
        "coordinator: connections queue, no handshake is answered), and a "
        "`FlightGroup(directory=d, codec=JSON, "
        f"reconnect_timeout={out.reconnect_timeout:g})` in the benchmark's process. Each "
        "`g.run_sync(key, work)` is timed in the caller's thread, sequentially; the work "
        "never runs. The first call of each try waits until the group gives up on the "
        "coordinator: each handshake attempt waits what is left of reconnect_timeout but "
        "at least 0.5 s, and one more attempt follows the one that spent it, so with "
        f"reconnect_timeout={out.reconnect_timeout:g} about 1 s. In the first try, "
        f"{out.calls} calls of one key, then {out.calls} of distinct keys, follow. Times "
        "in ms.",
        "",
        "| series | calls | p50 | p99 | max | raised UnavailableError |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {series} | {len(values)} | {_ms(_pct(values, 50))} | "
            f"{_ms(_pct(values, 99))} | {_ms(max(values))} | {_raised(r)} |"
            for series, values in rows
            if values
        ),
        "",
        "The coordinator gone: the benchmark closes its socket, removes `flight.sock` and "
        "lets go of `flight.lock`; from then until a call (tried every "
        f"{POLL * 1e3:g} ms, refused until then) led, this process having won the "
        "election and serving: "
        + ", ".join(_ms(t) for t in out.back)
        + f" ms. Goal: < {BACK_GOAL * 1e3:,g} ms.",
        "",
    ]
