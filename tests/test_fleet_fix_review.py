"""A review of the fleet fixes that followed tests/test_fleet_adversarial.py (fork
handling, wide keys, TTL clamp, land() under the start lock, _wait's errors, the
ACQUIRE/FORGET change).

Each bug below is fixed; each test failed for the reason it names on the code before
its fix (a strict xfail until then). The orders are forced with events, patched steps
and a proxy that cuts and holds replies.

- ``test_a_resent_acquire_still_leads_its_parked_flight_when_a_new_flight_started``:
  ACQUIRE looks for the call's own parked flight (``…:o:<nonce>``) only after it looked
  at the current record. A FORGET followed by a call of the key (the usual "forget, then
  call") leads a new flight in the gap; the re-sent ACQUIRE then joins that one and the
  parked flight, which the caller did lead, is never renewed nor landed: its joiners are
  interrupted a lease later although its leader lives.
- ``test_a_forget_posted_as_the_loop_shuts_down_does_not_wait_out_its_timeout``: _wait
  checks nothing under the start lock: a FORGET posted to the group's loop after it
  stopped and before it closed is dropped; forget() waits its whole timeout and raises
  UnavailableError ("cannot reach Redis"), not GroupClosedError.
- ``test_close_with_a_lease_past_timeout_max_hands_over_the_landing``: close() waits for
  its steps with ``future.result(2 * 5 + lease)``; a lease past threading.TIMEOUT_MAX
  (accepted: the TTL clamp was made for such leases) raises OverflowError there, which is
  suppressed: the loop is stopped at once and a landing made before close() is dropped.
- ``test_status_shows_the_raw_key_of_a_plain_key_that_starts_with_a_nul`` (both wide
  scopes): status() (and ``flightgroup status``) showed the wire key, with the NUL
  added by ADR 0019, while API.md and docs/cli.md promise "the raw key".
- ``test_a_group_made_before_a_fork_names_the_child_as_the_leader``: ADR 0018 says a group
  made but not started before a fork works in the child "as a new group"; the arbiter
  took ``os.getpid()`` at construction, so the child's flights name the parent as leader.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
    GroupClosedError,
    Retention,
    UnavailableError,
    current_lease,
)

from .infleet import fleet_group, fleet_of, never
from .infresh import held
from .redisproc import HoldingCutProxy, RedisServer
from .support import in_thread, outcome, wait_until

pytestmark = pytest.mark.timeout(60)


# -- 1. a re-sent ACQUIRE after "forget, then call" ------------------------------------


def test_a_resent_acquire_still_leads_its_parked_flight_when_a_new_flight_started(
    redis_server: RedisServer, holding_proxy: HoldingCutProxy, namespace: str
) -> None:
    """A's ACQUIRE leads t1 in Redis; its reply is cut and redis-py's re-send waits at
    the proxy. B joins t1. Another process forgets the key and calls it at once (its
    work runs, held): it leads t2. A's re-send is let through: it must lead t1 again
    (its nonce's ``…:o:`` key names t1, still running with A's nonce), so B gets A's
    value. It joins t2 instead; t1 is never renewed, and B gets FlightInterruptedError
    a lease later."""
    key = f"acq-{uuid.uuid4().hex}"
    a = fleet_group(holding_proxy.url, namespace, lease=1.5)
    b = fleet_group(redis_server.url, namespace, lease=1.5)
    other = fleet_group(redis_server.url, namespace, lease=1.5)
    joined, other_runs, other_release = threading.Event(), threading.Event(), threading.Event()
    tokens: list[int] = []

    def work() -> str:
        tokens.append(current_lease().token)
        return "A's value"

    def other_work() -> str:
        other_runs.set()
        other_release.wait(20)
        return "the other's value"

    threads: list[threading.Thread] = []
    try:
        a.run_sync("warm-up", lambda: 0)  # scripts loaded, a connection idles
        holding_proxy.arm(key.encode())  # ACQUIRE carries the raw key
        lead, led = in_thread(a.run_sync, key, work)
        threads.append(lead)
        assert holding_proxy.held.wait(10)  # t1 led in Redis; the re-send is held
        assert holding_proxy.cuts == 1
        join, got = in_thread(b.run_sync, key, never, on_join=joined.set, timeout=15)
        threads.append(join)
        assert joined.wait(10)  # B waits for t1
        other.forget(key)  # t1 parked (…:o:<A's nonce> names it)
        second, _ = in_thread(other.run_sync, key, other_work, timeout=20)
        threads.append(second)
        assert other_runs.wait(10)  # t2 runs, led by the other process
        holding_proxy.release()  # A's re-sent ACQUIRE reaches Redis now
        join.join(15)
        other_release.set()
        lead.join(15)
    finally:
        holding_proxy.release()
        other_release.set()
        for thread in threads:
            thread.join(15)
        for g in (a, b, other):
            g.close()
    result = outcome(got)
    assert not isinstance(result, FlightInterruptedError), (
        f"B's flight t1 was dropped while its leader A lived: {result!r}; "
        f"A got {outcome(led)!r}, its work ran {len(tokens)} time(s)"
    )
    assert result.value == "A's value" and result.joined
    assert outcome(led).value == "A's value" and not outcome(led).joined


# -- 2. forget() posted as the loop shuts down ----------------------------------------


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_a_forget_posted_as_the_loop_shuts_down_does_not_wait_out_its_timeout(
    redis_server: RedisServer, namespace: str
) -> None:
    """forget() passes its ``_closing`` check; close() then runs to the point where the
    group's loop has stopped and its thread is about to close it; only then does the
    forget post its FORGET (it lands in the loop's queue, which loop.close() drops).
    The commit promises that a forget racing close raises GroupClosedError (or it
    could return, as forget on a closed group does); it waits 4 command timeouts + 1 s
    and raises UnavailableError."""
    g = fleet_group(redis_server.url, namespace, lease=1.0)  # forget's own bound: 5 s
    g.run_sync("warm-up", lambda: 0)
    fleet = fleet_of(g)
    loop = fleet._background.loop
    assert loop is not None
    in_forget, loop_closing, posted = threading.Event(), threading.Event(), threading.Event()
    forget_thread: list[int] = []
    real_ensure = fleet._ensure_started
    real_close, real_post = loop.close, loop.call_soon_threadsafe

    def ensure_started() -> asyncio.AbstractEventLoop:
        started = real_ensure()
        forget_thread.append(threading.get_ident())
        in_forget.set()  # past forget()'s check of _closing
        loop_closing.wait(10)
        return started

    def close_loop() -> None:  # on the group's thread: the loop stopped, not closed
        loop_closing.set()
        posted.wait(10)
        real_close()

    def call_soon_threadsafe(callback: Any, *args: Any, **kwargs: Any) -> Any:
        handle = real_post(callback, *args, **kwargs)
        if forget_thread and threading.get_ident() == forget_thread[0]:
            posted.set()  # the FORGET is queued on the stopped loop
        return handle

    fleet._ensure_started = ensure_started  # type: ignore[method-assign]
    loop.close = close_loop  # type: ignore[method-assign]
    loop.call_soon_threadsafe = call_soon_threadsafe  # type: ignore[method-assign]
    forgetting, out = in_thread(g.forget, "k")
    closing: threading.Thread | None = None
    try:
        assert in_forget.wait(10)
        closing, _ = in_thread(g.close)
        forgetting.join(20)
    finally:
        loop_closing.set()
        posted.set()
        forgetting.join(20)
        if closing is not None:
            closing.join(20)
    ended = outcome(out)
    assert not isinstance(ended, UnavailableError), (
        f"forget() waited out its timeout on a closed group's dropped FORGET: {ended!r}"
    )
    assert ended is None or isinstance(ended, GroupClosedError), repr(ended)


# -- 3. close() with a lease past threading.TIMEOUT_MAX ---------------------------------


def test_close_with_a_lease_past_timeout_max_hands_over_the_landing(
    redis_server: RedisServer, namespace: str
) -> None:
    """The leader's work returned; its COMPLETE is about to be sent (held on a gate)
    when close() runs. close() must hand the landing over (API: "close() returns once
    the landings already made have been handed over"); the gate opens once close()
    returned, or after it waited a second. With lease=1e10 s (finite, accepted, past
    threading.TIMEOUT_MAX ~9.2e9 s) close() returns at once and the loop stops under the
    landing: the joiner elsewhere waits (here to its own timeout), the record runs."""
    a = fleet_group(redis_server.url, namespace, lease=1e10)
    b = fleet_group(redis_server.url, namespace, lease=1.0)
    fleet = fleet_of(a)
    a.run_sync("warm-up", lambda: 0)
    started, joined = threading.Event(), threading.Event()
    completing, gate = threading.Event(), threading.Event()
    original = fleet._script

    async def script(which: str, keys: Any, args: Any) -> Any:
        if which == "complete":
            completing.set()
            await asyncio.get_running_loop().run_in_executor(None, gate.wait, 20)
        return await original(which, keys, args)

    fleet._script = script  # type: ignore[method-assign]

    def work() -> str:
        started.set()
        assert joined.wait(10)
        return "v"

    lead, _ = in_thread(a.run_sync, "k", work)
    join: threading.Thread | None = None
    closing: threading.Thread | None = None
    try:
        assert started.wait(10)
        join, got = in_thread(b.run_sync, "k", never, on_join=joined.set, timeout=8)
        assert completing.wait(10)  # the work returned; land() posted the landing
        closing, _ = in_thread(a.close)
        closing.join(1.0)  # returned at once (the bug), or waits for the landing
        gate.set()
        closing.join(20)
        join.join(15)
    finally:
        joined.set()
        gate.set()
        lead.join(15)
        if join is not None:
            join.join(15)
        if closing is not None:
            closing.join(20)
        b.close()
    result = outcome(got)
    assert not isinstance(result, TimeoutError), "the landing made before close() was dropped"
    assert result.value == "v" and result.joined


# -- 4. status() shows the wire key ----------------------------------------------------


@pytest.mark.parametrize("scope", ["fleet", "directory"])
def test_status_shows_the_raw_key_of_a_plain_key_that_starts_with_a_nul(
    redis_server: RedisServer, namespace: str, directory: str, scope: str
) -> None:
    """A plain key that starts with a NUL is sent with one more (ADR 0019); status()
    of either wide scope shows it as its caller gave it."""
    if scope == "fleet":
        g = fleet_group(redis_server.url, namespace)
    else:
        g = FlightGroup(directory=directory, codec=JSON)
    started, release = threading.Event(), threading.Event()
    thread, out = in_thread(g.run_sync, "\x00k", held([], "v", started, release))
    try:
        assert started.wait(10)
        assert g._scope is not None
        keys = [flight["key"] for flight in g._scope.status()]
    finally:
        release.set()
        thread.join(10)
        g.close()
    assert outcome(out).value == "v"
    assert keys == ["\x00k"], keys


# -- 5. a group made before a fork and first used in the child -------------------------

# Made (not started) before the fork, as a pre-forking server's module-level group: the
# child leads "k" (its work waits on the parent); the parent asks status() through a
# group of its own. Prints the pids as JSON.
_PRE_FORK_GROUP = r"""
import json, os, sys
from flightgroup import JSON, FlightGroup
url, namespace = sys.argv[1], sys.argv[2]
group = FlightGroup(redis=url, namespace=namespace, codec=JSON)  # not started
running_r, running_w = os.pipe()
go_r, go_w = os.pipe()
child = os.fork()
if child == 0:
    def work():
        os.write(running_w, b"r")
        os.read(go_r, 1)
        return "v"
    try:
        group.run_sync("k", work, timeout=20)
    finally:
        os._exit(0)
assert os.read(running_r, 1) == b"r"
probe = FlightGroup(redis=url, namespace=namespace, codec=JSON)
try:
    flights = probe._scope.status(timeout=10)
finally:
    os.write(go_w, b"g")
    os.waitpid(child, 0)
    probe.close()
print(json.dumps({"parent": os.getpid(), "child": child,
                  "leaders": [flight["leader_pid"] for flight in flights]}), flush=True)
"""


def test_a_group_made_before_a_fork_names_the_child_as_the_leader(
    redis_server: RedisServer, namespace: str
) -> None:
    """ADR 0018: a group made but never started before the fork "has nothing of the
    parent's. It works in the child as a new group." Its flights led in the child must
    show the child's pid in status() (``flightgroup status``'s LEADER PID, the CLI
    joiner's "leader pid" line)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PRE_FORK_GROUP, redis_server.url, namespace],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["leaders"] == [seen["child"]], seen


# -- a second close() waits for the first ----------------------------------------------


def test_a_second_close_returns_only_once_the_first_handed_the_landing_over(
    redis_server: RedisServer, namespace: str
) -> None:
    """API.md: "close() returns once the landings already made have been handed over".
    A second close() (another thread, or ``with`` after an explicit close) returned at
    once while the first still handed a landing over: a program that exits then loses
    it, and joiners elsewhere wait a lease out. (The directory scope's twin:
    test_directory_review2.py.)"""
    a = fleet_group(redis_server.url, namespace, lease=5.0)
    fleet = fleet_of(a)
    a.run_sync("warm-up", lambda: 0)
    completing, gate, completed = threading.Event(), threading.Event(), threading.Event()
    original = fleet._script

    async def script(which: str, keys: Any, args: Any) -> Any:
        if which != "complete":
            return await original(which, keys, args)
        completing.set()
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 20)
        try:
            return await original(which, keys, args)
        finally:
            completed.set()

    fleet._script = script  # type: ignore[method-assign]
    waiting = threading.Event()

    class Watched(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waiting.set()  # the second close() waits for the first one
            return super().wait(timeout)

    fleet._close_returned = Watched()  # type: ignore[misc]
    first: threading.Thread | None = None
    second: threading.Thread | None = None
    # The leader's call returns once its landing was handed over: it waits in a thread.
    # (Called here, it waited the gate's 20 s out, the landing was handed over before
    # any close(), and the second close() was seen waiting only by luck.)
    leader, led = in_thread(a.run_sync, "k", lambda: "v")
    try:
        assert completing.wait(10)  # the landing is made, its COMPLETE held
        first, _ = in_thread(a.close)
        wait_until(lambda: fleet._closing, "the first close began")

        def second_close() -> bool:
            a.close()
            return completed.is_set()  # what was handed over when it returned

        second, handed = in_thread(second_close)
        assert waiting.wait(10)
        assert second.is_alive()  # it waits while the landing is held
        gate.set()
        second.join(20)
        first.join(20)
        assert outcome(handed) is True
        leader.join(20)
        # API.md: a leader still waiting in a group that closes raises GroupClosedError
        # (its landing was handed over all the same).
        assert isinstance(outcome(led), GroupClosedError), led
    finally:
        gate.set()
        for thread in (leader, first, second):
            if thread is not None:
                thread.join(20)


def test_a_lease_and_a_keep_near_the_float_maximum_are_taken(
    redis_server: RedisServer, namespace: str
) -> None:
    """API.md: construction checks its arguments. A finite lease near sys.float_info.max
    passed the check, then overflowed to infinity in milliseconds (OverflowError at
    construction); a keep that large overflowed at the landing. Both are capped at the
    longest TTL the fleet sets."""
    huge = sys.float_info.max
    g = fleet_group(redis_server.url, namespace, lease=huge,
                    retention=Retention(success=huge))
    try:
        assert g.run_sync("k", lambda: "v").joined is False
        again = g.run_sync("k", lambda: "other")
        assert (again.value, again.joined) == ("v", True)  # kept
    finally:
        g.close()
