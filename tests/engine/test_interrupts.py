"""Cancellation and interrupts: a leader stopped by a KeyboardInterrupt outside its
work, and a work whose error cannot be printed, still settle their flight, so its
joiners are woken and a later call of the key never joins a flight nobody ends. Each
test forces its interleaving (events, a patched private step that raises where a signal
handler would), never a lucky sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest

from flightgroup import (
    FlightFailedError,
    FlightGroup,
    FlightInterruptedError,
    GroupClosedError,
    LeaseLostError,
)

from ..ingroup import scope_groups
from ..support import held_lead, in_thread, outcome, raised, wait_until

pytestmark = pytest.mark.timeout(60)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this error")


def test_a_work_error_that_cannot_be_printed_still_lands(g: FlightGroup) -> None:
    """Its joiners' FlightFailedError is made from the error's str(), which raised: in
    the wide scopes the landing stopped half way (the flight settling, the key held in
    the scope), in the process scope each joiner raised the __str__'s ValueError."""
    release, joined = threading.Event(), threading.Event()

    def work() -> str:
        assert release.wait(20)
        raise Unprintable()

    led, got = _lead_then_join(g, work, joined, release)
    assert type(led) is Unprintable
    assert type(got) is FlightFailedError, got
    assert got.error_type.endswith("Unprintable")
    assert got.message == "<exception str() failed>"
    # The key is free again: the next call leads.
    result = g.run_sync("k", lambda: "next", timeout=20)
    assert (result.value, result.joined) == ("next", False)


def _lead_then_join(
    g: FlightGroup, work: Any, joined: threading.Event, release: threading.Event
) -> tuple[Any, Any]:
    """A leader's call of "k" on a thread; once its flight is in the table, a joiner's
    (its on_join sets ``joined``); then ``release`` lets the work go on. Returns what
    each ended with: its Result, or its error."""
    leader, led = in_thread(g.run_sync, "k", work)
    wait_until(lambda: g.stats().in_flight == 1, "the leader's flight")
    joiner, got = in_thread(g.run_sync, "k", lambda: "never", on_join=joined.set)
    assert joined.wait(20)
    release.set()
    leader.join(20)
    joiner.join(20)
    return outcome(led), outcome(got)


def _interrupt(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, after: threading.Event | None = None
) -> None:
    """Make ``owner.name`` raise KeyboardInterrupt once (once ``after`` is set), as a
    signal handler would at that point of the leader's thread."""
    real = getattr(owner, name)
    fired: list[bool] = []

    def step(*args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(True)
            if after is not None:
                assert after.wait(20)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, step)


@pytest.mark.parametrize("where", ["before the work", "measuring the outcome"])
def test_a_keyboard_interrupt_outside_the_work_interrupts_the_flight(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A KeyboardInterrupt in the leader's thread between its arrival and its settle,
    but outside the work (as its attempt starts; while the outcome's size is measured
    for Retention, which calls the value's __sizeof__): the flight ends, never left
    running with no work for its joiners and every later call to wait on: interrupted
    before the work, as an interrupt in the work does (ADR 0008); with the value after
    it, for every caller but the leader (not kept)."""
    import flightgroup.engine.attempts as attempts_module
    from flightgroup import Retention

    joined = threading.Event()
    release = threading.Event()
    if where == "before the work":
        g = FlightGroup()
        # The step that starts the work's attempt raises (once a joiner waits), not
        # the work.
        _interrupt(monkeypatch, attempts_module, "attempt_sync", after=joined)
    else:
        g = FlightGroup(retention=Retention(success=60.0, max_bytes=1 << 20))
        _interrupt(monkeypatch, attempts_module, "estimate_size")
    if where == "measuring the outcome":
        # The joiner must be waiting before the leader lands: the work waits for it.
        def work() -> str:
            assert release.wait(20)
            return "v"
    else:
        def work() -> str:
            return "v"

    led, got = _lead_then_join(g, work, joined, release)
    if where == "measuring the outcome":
        # The work's value was made: the joiner gets it; it is not kept (unmeasured).
        assert got.value == "v", got
        assert g.stats().kept == 0
    else:
        assert type(got) is FlightInterruptedError, got
    assert type(led) is KeyboardInterrupt
    assert g.stats().in_flight == 0
    result = g.run_sync("k", lambda: "next", timeout=20)
    assert (result.value, result.joined) == ("next", False)
    g.close()


@pytest.mark.parametrize("how", ["forget", "close"])
def test_run_sync_on_the_loop_of_a_left_flights_work_raises(directory: str, how: str) -> None:
    """run_sync on the thread of the loop that runs a directory flight's async work
    raises RuntimeError (ADR 0006): it would wait for the key lock that very work
    holds. A flight that left its table while its work runs (forget() detached it, or
    its group closed and a new one took the directory) is seen too: the call never leads
    in the scope and blocks the loop for ever."""
    from flightgroup import JSON

    groups = [FlightGroup(directory=directory, codec=JSON)]

    async def main() -> str:
        task, go = await held_lead(groups[0], "k")
        if how == "close":
            groups[0].close()  # its work runs on, holding the key lock
            groups.append(FlightGroup(directory=directory, codec=JSON))
        else:
            groups[0].forget("k")  # detached: its work runs on, holding the key lock
        with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="block"):
            groups[-1].run_sync("k", lambda: "new")
        go.set()
        if how == "close":
            with pytest.raises(GroupClosedError):
                await task
            return "closed"
        return (await task).value

    assert asyncio.run(main()) == ("closed" if how == "close" else "old")
    # Once the old work ended, the key leads again.
    assert groups[-1].run_sync("k", lambda: "new", timeout=20).value == "new"
    for g in groups:
        g.close()


@pytest.mark.parametrize("when", ["before the scope answers", "joined elsewhere"])
@pytest.mark.parametrize("scope", ["directory", "fleet"])
def test_an_interrupted_wide_leading_caller_withdraws_only_itself(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, scope: str, when: str
) -> None:
    """A wide group's run_sync caller (no timeout, no deadline) waits for the scope in
    its own thread: a KeyboardInterrupt there (here raised where the signal handler
    would, in its wait) withdraws that caller alone, never every local joiner of the
    flight: the flight goes on, on a thread of its own, from where it was: it leads here
    and runs the work, or follows the flight led elsewhere."""
    from flightgroup.scope.events import Inbox

    here, elsewhere = scope_groups(request, scope, 2, lease=5.0)
    release, running = threading.Event(), threading.Event()
    runs: list[str] = []

    def work() -> str:
        runs.append("work")
        running.set()
        assert release.wait(20)
        return "the value"

    others: list[Any] = []
    if when == "joined elsewhere":
        other = threading.Thread(target=lambda: others.append(elsewhere.run_sync("k", work)))
        other.start()
        assert running.wait(20)
    joiner_in = threading.Event()
    caller: list[threading.Thread] = []
    real_wait = Inbox.wait_sync
    interrupted: list[bool] = []
    answers: list[Any] = []

    def wait_sync(self: Inbox) -> Any:
        if caller and threading.current_thread() is caller[0] and not interrupted:
            if when == "joined elsewhere" and not answers:
                answers.append(real_wait(self))  # JOINED: acted on; the next wait is cut
                return answers[0]
            assert joiner_in.wait(20)
            interrupted.append(True)
            raise KeyboardInterrupt
        return real_wait(self)

    monkeypatch.setattr(Inbox, "wait_sync", wait_sync)
    outcomes: dict[str, Any] = {}

    def call(name: str, **kw: Any) -> None:
        try:
            outcomes[name] = here.run_sync("k", work, **kw)
        except BaseException as exc:
            outcomes[name] = exc

    caller.append(threading.Thread(target=call, args=("caller",)))
    caller[0].start()
    wait_until(lambda: here.stats().in_flight == 1, "the local flight")
    joiner = threading.Thread(target=call, args=("joiner",))
    joiner.start()
    # (calls, not joins: a flight joined elsewhere counts its leading caller as a join)
    wait_until(lambda: here.stats().calls == 2, "the local joiner")
    joiner_in.set()
    caller[0].join(20)
    assert isinstance(outcomes["caller"], KeyboardInterrupt), outcomes
    if when == "before the scope answers":
        assert running.wait(20)  # it led here, on a thread of its own
    release.set()
    joiner.join(20)
    result = outcomes["joiner"]
    assert not isinstance(result, BaseException), outcomes
    assert (result.value, result.joined) == ("the value", True)
    assert runs == ["work"]
    if when == "joined elsewhere":
        other.join(20)
        assert others[0].value == "the value"
    for g in (here, elsewhere):
        g.close()


class _InterruptedText(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt  # a signal arriving while str() runs


def test_a_failure_whose_str_is_interrupted_still_lands(
    request: pytest.FixtureRequest, g: FlightGroup
) -> None:
    """Landing a failure in a wide scope describes it (str(), user code). Interrupted
    there, the flight lands interrupted instead of stopping half way (settling, never
    handed to the scope, its key held for this process and the others); the process
    scope never calls str() to land."""
    def work() -> str:
        raise _InterruptedText()

    leader, box = in_thread(g.run_sync, "k", work)
    leader.join(20)
    assert isinstance(outcome(box), KeyboardInterrupt | _InterruptedText), box
    assert g.stats().in_flight == 0
    result = g.run_sync("k", lambda: "next", timeout=20)
    assert (result.value, result.joined) == ("next", False)
    scope = request.node.callspec.params["g"]
    if scope != "process":  # and a stranger of the scope (as another process is)
        [other] = scope_groups(request, scope, 1, lease=5.0)
        try:
            assert other.run_sync("k", lambda: "other", timeout=20).value == "other"
        finally:
            other.close()


def test_an_interrupt_in_the_retry_threads_start_hands_the_retry_over_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An interrupt in the retry pause hands the retry to a thread; a second one that
    comes inside Thread.start(), once the thread got going, does not also end the
    flight (the retry thread would fail on a settled flight and the joiner get
    FlightInterruptedError). Both interrupts are raised where a handler would."""
    import time

    from flightgroup import Retry

    real_start = threading.Thread.start
    paused = threading.Event()

    def start(self: threading.Thread) -> None:
        real_start(self)
        if self.name.startswith("flightgroup-retry-"):
            raise KeyboardInterrupt  # the second interrupt, in start()'s wait

    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread() is threading.main_thread() and not paused.is_set():
            paused.set()
            raise KeyboardInterrupt  # the first, in the retry pause
        real_sleep(seconds)

    monkeypatch.setattr(threading.Thread, "start", start)
    g = FlightGroup(retry=Retry(attempts=2, backoff=0.05, jitter=False))
    runs: list[int] = []
    joined = threading.Event()

    def work() -> str:
        runs.append(1)
        if len(runs) == 1:
            assert joined.wait(20)
            raise ValueError("the first attempt fails")
        return "the second attempt"

    got: list[Any] = []

    def join() -> None:
        wait_until(lambda: g.stats().in_flight == 1, "the leader's flight")
        got.append(g.run_sync("k", work, on_join=joined.set, timeout=20))

    joiner = threading.Thread(target=join)
    real_start(joiner)
    monkeypatch.setattr(time, "sleep", sleep)
    with pytest.raises(KeyboardInterrupt):
        g.run_sync("k", work)
    joiner.join(20)
    assert [r.value for r in got] == ["the second attempt"], got
    assert len(runs) == 2
    g.close()


@pytest.mark.parametrize("how", ["forget", "close"])
def test_in_the_fleet_run_sync_on_the_loop_of_a_left_flights_work_leads(
    redis_server: Any, namespace: str, how: str
) -> None:
    """In the fleet a flight that left its table holds nothing in Redis (its lease is
    lost, or it was parked): a run_sync of its key on its work's loop thread leads beside
    it; only the directory's key lock makes that call wait for the work."""
    from flightgroup import JSON

    groups = [FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)]

    async def main() -> Any:
        task, go = await held_lead(groups[0], "k")
        if how == "close":
            groups[0].close()
            groups.append(FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON))
        else:
            groups[0].forget("k")
        with pytest.warns(RuntimeWarning, match="blocks that loop"):
            result = groups[-1].run_sync("k", lambda: "new", timeout=20)
        go.set()
        with contextlib.suppress(GroupClosedError, LeaseLostError):
            await task
        return result

    result = asyncio.run(main())
    assert (result.value, result.joined) == ("new", False)
    for g in groups:
        g.close()


def test_in_the_fleet_run_sync_on_the_loop_of_a_flight_being_forgotten_raises(
    redis_server: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until Redis confirms a forget() made on another thread, the scope still knows
    the old flight: a run_sync of its key on the loop thread that runs its work would
    join it and block that work. It is refused, as on the directory's key lock; once
    the forget is confirmed, the same call leads beside the old flight."""
    from flightgroup import JSON

    from ..infleet import fleet_of

    g = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    scope = fleet_of(g)
    real_forget = scope.forget
    asking, confirm = threading.Event(), threading.Event()

    def forget(wire_key: str) -> None:
        asking.set()
        assert confirm.wait(20)
        real_forget(wire_key)

    monkeypatch.setattr(scope, "forget", forget)

    async def main() -> tuple[Any, Any]:
        task, go = await held_lead(g, "k")
        forgetting, box = in_thread(g.forget, "k")
        await asyncio.to_thread(asking.wait, 20)
        with pytest.warns(RuntimeWarning, match="blocks that loop"):
            refused = raised(g.run_sync, "k", lambda: "new", timeout=5)
        confirm.set()
        await asyncio.to_thread(forgetting.join, 20)
        assert box == {"result": None}
        with pytest.warns(RuntimeWarning, match="blocks that loop"):
            after = g.run_sync("k", lambda: "new", timeout=20)
        go.set()
        with contextlib.suppress(LeaseLostError):
            await task
        return refused, after

    refused, after = asyncio.run(main())
    assert isinstance(refused, RuntimeError), refused
    assert "would block that work" in str(refused)
    assert (after.value, after.joined) == ("new", False)
    g.close()


def test_a_call_refused_before_the_scope_is_asked_counts_as_no_flight(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory on a network file system refuses every call before any request
    (NetworkDirectoryError); such a call counts in calls only, as a call the scope
    could not serve does (ADR 0031): it counted as an interrupted flight, timed."""
    from flightgroup import JSON
    from flightgroup.directory import fs
    from flightgroup.errors import NetworkDirectoryError

    def network(path: str, mountinfo: str | None = None) -> str:
        return "nfs4"

    monkeypatch.setattr(fs, "file_system_of", network)
    monkeypatch.setattr(fs, "_local_cache", {})
    g = FlightGroup(directory=directory, codec=JSON)
    for _ in range(2):
        with pytest.raises(NetworkDirectoryError):
            g.run_sync("k", lambda: 1)
    with pytest.raises(NetworkDirectoryError):
        asyncio.run(g.run("k", lambda: asyncio.sleep(0, 1)))
    stats = g.stats()
    assert (stats.calls, stats.flights, stats.joins, stats.interrupted) == (3, 0, 0, 0), stats
    assert stats.in_flight == 0 and stats.flight_seconds_p99 == 0.0, stats
    g.close()


def test_forgets_unavailable_error_carries_the_key() -> None:
    """docs/api.md: every error that concerns a key has `.key`; forget()'s too, a decorated
    function's with the key its function gave."""
    from flightgroup import JSON, UnavailableError

    from ..redisproc import refused_port

    with refused_port() as port:
        g = FlightGroup(redis=f"redis://127.0.0.1:{port}/0", namespace="n", codec=JSON)

        @g.coalesce(key=lambda n: f"user:{n}")
        def user(n: int) -> int:
            return n

        with pytest.raises(UnavailableError) as caught:
            g.forget("k1")
        assert caught.value.key == "k1"
        with pytest.raises(UnavailableError) as caught:
            user.forget(7)
        assert caught.value.key == "user:7"
        g.close()


@pytest.mark.parametrize("when", ["waiting", "read, not taken", "taken"])
@pytest.mark.parametrize("scope", ["directory", "fleet"])
def test_an_interrupt_waiting_for_a_retrys_token_withdraws_only_the_caller(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, scope: str, when: str
) -> None:
    """Between two attempts a wide leader asks the scope for the retry's token, in its
    caller's thread (no timeout, no deadline). Interrupted there (not in the work), the
    caller withdraws and the retry goes on, on a thread of its own, as after an interrupt
    in the retry's pause: its local joiners are not interrupted."""
    from flightgroup import JSON, Retry
    from flightgroup.scope.events import Inbox

    retry = Retry(attempts=2, backoff=0.0, jitter=False)
    if scope == "directory":
        g = FlightGroup(directory=request.getfixturevalue("directory"), codec=JSON, retry=retry)
    else:
        server, ns = request.getfixturevalue("redis_server"), request.getfixturevalue("namespace")
        g = FlightGroup(redis=server.url, namespace=ns, codec=JSON, retry=retry)
    caller = threading.current_thread()
    real_wait, real_take = Inbox.wait_sync, Inbox.take
    reads: list[int] = []

    def wait_sync(self: Inbox) -> Any:
        if threading.current_thread() is caller:
            reads.append(1)
            # The first read is the lead; the second, the retry's token.
            if len(reads) == 2 and when == "waiting":
                raise KeyboardInterrupt
        return real_wait(self)

    def take(self: Inbox, item: Any) -> None:
        # The interrupt comes once the token was read: before it is taken, or after.
        if threading.current_thread() is caller and len(reads) == 2 and when != "waiting":
            reads.append(1)
            if when == "taken":
                real_take(self, item)
            raise KeyboardInterrupt
        real_take(self, item)

    monkeypatch.setattr(Inbox, "wait_sync", wait_sync)
    monkeypatch.setattr(Inbox, "take", take)
    joined = threading.Event()
    runs: list[int] = []

    def work() -> str:
        runs.append(1)
        if len(runs) == 1:
            assert joined.wait(20)
            raise ValueError("the first attempt fails")
        return "the second attempt"

    got: list[Any] = []

    def join() -> None:
        wait_until(lambda: g.stats().in_flight == 1, "the leader's flight")
        try:
            got.append(g.run_sync("k", work, on_join=joined.set, timeout=20))
        except BaseException as exc:
            got.append(exc)

    joiner = threading.Thread(target=join)
    joiner.start()
    with pytest.raises(KeyboardInterrupt):
        g.run_sync("k", work)
    joiner.join(20)
    assert [getattr(r, "value", r) for r in got] == ["the second attempt"], got
    assert len(runs) == 2
    g.close()


def test_an_interrupt_that_stops_a_work_whose_lease_was_lost_still_stops_the_loop(
    g: FlightGroup,
) -> None:
    """An async work whose lease was lost, then stopped by KeyboardInterrupt: the
    interrupt reaches the loop's runner (the driver re-raises what stopped the work), in
    every scope; in the wide scopes too, where the landing comes back lost, it is never
    swallowed into a LeaseLostError the caller could catch, the program running on."""
    import flightgroup.group as group_module

    async def work() -> str:
        attempt = group_module._CURRENT.get()
        assert attempt is not None
        attempt.revoked = True  # the scope took the lease (as a failed renewal does)
        attempt.lose()
        raise KeyboardInterrupt  # ... and a signal lands in the work

    caught: list[BaseException] = []

    async def main() -> None:
        try:
            await g.run("k", work)
        except Exception as exc:  # what a program catches; an interrupt goes on up
            caught.append(exc)

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main())
    finally:
        loop.close()
    assert not caught, caught  # no caller took it for a catchable error
    wait_until(lambda: g.stats().in_flight == 0, "the flight's end")
