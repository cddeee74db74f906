"""The fleet scope while Redis is down: how long a call takes to fail, and how soon calls
go through Redis again once it is back (the fleet section's measurement (5)).

A ``redis-server`` of the measurement's own (``fleet.RedisServer``, a free loopback
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
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .scenarios import quiet

if TYPE_CHECKING:
    from .fleet import RedisServer
    from .report import Target

__all__ = ["BACK_GOAL", "REFUSED_GOAL", "Calls", "Outage", "lines", "measure", "ok", "targets"]

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
    at_once: int = 0  # of them, refused as "out of reach for" (the breaker's text)
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
        calls.at_once += "out of reach for" in str(exc)
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
            + f" ms (the probe PINGs every {PROBE_EVERY:g} s). Goal: < {BACK_GOAL * 1e3:,g} "
            "ms.",
        ]
    return [*text, ""]
