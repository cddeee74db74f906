"""Fresh callers in the wide scopes (ADR 0005): a fresh caller that comes while its
process's flight still waits for the scope's answer joins that flight if the scope lets
it run here, since its work starts after the call; one that comes after the work
started waits for the end and shares the next flight.

The window between the scope's answer and the work's start is held open by a patched
``Bridge._lead`` that waits for an event, so every order below is forced.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import flightgroup.waiting as waiting_module
from flightgroup import JSON, FlightGroup, GroupClosedError, LeaseLostError, UnavailableError
from flightgroup.directory.client import DirectoryArbiter
from flightgroup.engine.table import FlightTable
from flightgroup.redis.arbiter import RedisArbiter
from flightgroup.redis.calls import FleetCall
from flightgroup.redis.names import Names
from flightgroup.scope.bridge import Bridge

from ..infleet import fleet_group, fleet_of, never
from ..infresh import fresh_waiting, held, lead_held, ran
from ..ingroup import Background, close, coordinating, group
from ..support import bridge_of, flight_of, scope_of, table_of, wait_until

pytestmark = pytest.mark.timeout(60)


def test_fresh_callers_that_came_before_the_lead_join_it(
    wide: FlightGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    g, runs, joined = wide, [], []
    hold, started, release, work, leader = lead_held(g, runs, monkeypatch)
    sync_fresh = Background(lambda: g.run_sync("k", work, fresh=True))

    async def async_call() -> Any:
        async def awork() -> str:
            return work()

        return await g.run("k", awork, fresh=True, on_join=lambda: joined.append(1))

    async_fresh = Background(lambda: asyncio.run(async_call()))
    fresh_waiting(g, "k", 2)
    hold.go.set()
    assert started.wait(10)
    # docs/api.md: on_join runs in the joiner before it waits, so while the work still runs
    wait_until(lambda: joined == [1], "the promoted async caller ran its on_join")
    release.set()
    first = leader.wait()
    results = [sync_fresh.wait(), async_fresh.wait()]
    assert runs == ["first"]
    assert [(r.value, r.joined, r.token) for r in results] == [("first", True, first.token)] * 2
    assert (first.value, first.joined) == ("first", False)
    assert joined == [1]  # on_join once, in the joiner that asked for it
    assert g.stats().joins == 2 and g.stats().flights == 1
    assert flight_of(g, "k") is None


def test_a_fresh_caller_that_comes_once_the_work_runs_shares_the_next_flight(
    wide: FlightGroup,
) -> None:
    g, runs = wide, []
    started, release = threading.Event(), threading.Event()
    leader = Background(lambda: g.run_sync("k", held(runs, "first", started, release)))
    assert started.wait(10)
    late = [
        Background(lambda: g.run_sync("k", lambda: runs.append("second") or "second", fresh=True))
        for _ in range(2)
    ]
    fresh_waiting(g, "k", 2)
    release.set()
    assert leader.wait().value == "first"
    results = [each.wait() for each in late]
    assert runs == ["first", "second"]
    assert sorted(r.joined for r in results) == [False, True]
    assert {r.value for r in results} == {"second"}


def test_a_promoted_caller_that_times_out_withdraws_alone(
    wide: FlightGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    g, runs = wide, []
    hold, started, release, work, leader = lead_held(g, runs, monkeypatch)
    impatient = Background(lambda: g.run_sync("k", work, fresh=True, timeout=0.3))
    fresh_waiting(g, "k", 1)
    hold.go.set()
    assert started.wait(10)
    # its timeout passes while the work runs (the work waits for release, set below)
    with pytest.raises(TimeoutError):
        impatient.wait()
    release.set()
    assert leader.wait().value == "first"
    assert runs == ["first"]
    assert flight_of(g, "k") is None  # no claim left behind (I4)
    again = g.run_sync("k", lambda: "again", fresh=True, timeout=10)
    assert (again.value, again.joined) == ("again", False)


def test_a_promoted_async_caller_cancelled_withdraws_alone(
    wide: FlightGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    g, runs = wide, []
    hold, started, release, work, leader = lead_held(g, runs, monkeypatch)
    outcome: list[str] = []

    async def cancelled_caller() -> None:
        async def awork() -> str:
            return work()

        task = asyncio.ensure_future(g.run("k", awork, fresh=True))
        await asyncio.get_running_loop().run_in_executor(None, fresh_waiting, g, "k", 1)
        hold.go.set()
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            outcome.append("cancelled")

    asyncio.run(cancelled_caller())
    assert outcome == ["cancelled"]
    release.set()
    assert leader.wait().value == "first"
    assert flight_of(g, "k") is None
    assert g.run_sync("k", lambda: "again", fresh=True, timeout=10).value == "again"
    assert runs == ["first"]


def test_a_promoted_caller_gets_group_closed_when_the_group_closes(
    wide: FlightGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    g, runs = wide, []
    hold, started, release, work, leader = lead_held(g, runs, monkeypatch)
    promoted = Background(lambda: g.run_sync("k", work, fresh=True))
    fresh_waiting(g, "k", 1)
    hold.go.set()
    assert started.wait(10)
    closing = Background(g.close)
    with pytest.raises(GroupClosedError):
        promoted.wait()
    release.set()
    closing.wait()
    with pytest.raises(GroupClosedError):  # the leader too: its group closed meanwhile
        leader.wait()
    assert runs == ["first"]


def test_a_promoted_caller_whose_on_join_raises_withdraws_alone(
    wide: FlightGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    g, runs = wide, []
    hold, _started, release, work, leader = lead_held(g, runs, monkeypatch)

    def refuse() -> None:
        raise LookupError("not this one")

    refusing = Background(lambda: g.run_sync("k", work, fresh=True, on_join=refuse))
    staying = Background(lambda: g.run_sync("k", work, fresh=True))
    fresh_waiting(g, "k", 2)
    hold.go.set()
    with pytest.raises(LookupError, match="not this one"):
        refusing.wait()  # raised while the work still runs: release is not set yet
    release.set()
    assert leader.wait().value == "first"
    assert (staying.wait().value, staying.wait().joined) == ("first", True)
    assert runs == ["first"]


def test_an_async_leading_caller_out_of_time_as_its_flight_joins_elsewhere_times_out(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's timer sets EXPIRED, then (before the caller's task resumes) its
    flight's driver learns the flight joined one led elsewhere and detaches the
    caller's waiter. The caller must raise TimeoutError, not read an outcome that
    does not exist yet."""
    a = coordinating(directory)
    b = FlightGroup(directory=directory, codec=JSON)
    try:
        started, release = threading.Event(), threading.Event()
        leader = Background(lambda: a.run_sync("k", held([], "old", started, release)))
        assert started.wait(10)
        original = waiting_module._expire

        def expire_then_join(fut: Any) -> None:
            original(fut)
            table_of(b).joined_remote(table_of(b).flights["k"])  # the JOIN's detach, right then

        monkeypatch.setattr(waiting_module, "_expire", expire_then_join)

        async def late() -> Any:
            async def work() -> str:
                return "never"

            return await b.run("k", work, timeout=0.3)

        with pytest.raises(TimeoutError):
            asyncio.run(late())
        release.set()
        assert leader.wait().value == "old"
    finally:
        close(a, b)


class _Gates:
    """Every inbox made from now on holds its events until ``open()``, which puts them
    all in at once: a driver then reads JOINED and LANDED in one step."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from flightgroup.directory import client as client_module
        from flightgroup.scope.events import Inbox, Landed, ScopeEvent

        gates = self
        self.inboxes: list[Any] = []
        self.landed = threading.Event()  # an outcome is held

        class Gated(Inbox):
            def __init__(self) -> None:
                super().__init__()
                self.held: list[ScopeEvent] = []
                self.opened = False
                gates.inboxes.append(self)

            def put(self, event: ScopeEvent) -> None:
                if not self.opened:
                    self.held.append(event)
                    if type(event) is Landed:
                        gates.landed.set()
                    return
                super().put(event)

            def open(self) -> None:
                self.opened = True
                for event in self.held:
                    super().put(event)

        monkeypatch.setattr(client_module, "Inbox", Gated)

    def joined(self) -> bool:
        from flightgroup.scope.events import Joined

        return any(type(event) is Joined for inbox in self.inboxes for event in inbox.held)

    def open(self) -> None:
        for inbox in self.inboxes:
            inbox.open()


def _out_of_time_as_it_joins_and_lands(
    directory: str, monkeypatch: pytest.MonkeyPatch, call: Callable[..., Any]
) -> None:
    """b's call of k joins a's flight, and its timer runs out just as JOINED and LANDED
    come together (``call(b, gates, on_join)`` forces that order). The caller was
    handed JOINED, so it is out of time as a joiner that never ran on_join:
    TimeoutError, never an outcome without on_join."""
    a = coordinating(directory)
    b = FlightGroup(directory=directory, codec=JSON)
    try:
        started, release = threading.Event(), threading.Event()
        leader = Background(lambda: a.run_sync("k", held([], "old", started, release)))
        assert started.wait(10)
        gates = _Gates(monkeypatch)  # b's call's inbox, not a's
        on_join: list[int] = []
        caller = Background(lambda: call(b, gates, lambda: on_join.append(1)))
        wait_until(gates.joined, "b's call joined a's flight (held)")
        release.set()
        assert leader.wait().value == "old"
        assert caller.done.wait(20)
        assert isinstance(caller.error, TimeoutError), caller.result
        assert on_join == []
    finally:
        close(a, b)


def test_an_async_leading_caller_out_of_time_as_its_flight_joins_and_lands_never_skips_on_join(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome is in before time runs out; the driver is woken first, then the
    caller's future expires before the driver's step runs (so the driver detaches it
    and settles the flight before the caller resumes)."""
    original = waiting_module._expire

    def call(b: FlightGroup, gates: _Gates, on_join: Callable[[], object]) -> Any:
        def expire(fut: Any) -> None:
            assert gates.landed.wait(20)
            gates.open()
            asyncio.get_running_loop().call_soon(original, fut)

        monkeypatch.setattr(waiting_module, "_expire", expire)

        async def late() -> Any:
            async def work() -> str:
                return "never"

            return await b.run("k", work, timeout=0.3, on_join=on_join)

        return asyncio.run(late())

    _out_of_time_as_it_joins_and_lands(directory, monkeypatch, call)


def test_a_sync_leading_caller_out_of_time_as_its_flight_joins_and_lands_never_skips_on_join(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync twin: the caller's wait times out; before it withdraws, its flight's
    driver (a thread) reads JOINED and LANDED and settles the flight."""
    original = FlightTable.withdraw

    def call(b: FlightGroup, gates: _Gates, on_join: Callable[[], object]) -> Any:
        def withdraw(table: FlightTable, flight: Any, waiter: Any) -> bool:
            if table is table_of(b) and flight.outcome is None:  # the caller, out of time
                assert gates.landed.wait(20)
                gates.open()
                wait_until(lambda: flight.outcome is not None, "the driver settled the flight")
            return original(table, flight, waiter)

        monkeypatch.setattr(FlightTable, "withdraw", withdraw)
        return b.run_sync("k", lambda: "never", timeout=0.3, on_join=on_join)

    _out_of_time_as_it_joins_and_lands(directory, monkeypatch, call)


def test_fresh_callers_of_two_groups_that_came_during_one_flight_share_the_next(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """a leads t (held). A fresh caller F of a comes (it waits in a's table for t's
    end); a fresh caller G of b comes (the coordinator holds it for t's end). t lands;
    G leads t2 (held) before F's run reaches the coordinator (held until then). F and
    G both came during t: F's run names t's token, so it joins t2 instead of waiting
    for t2's end and leading t3."""
    a = coordinating(directory)
    b = FlightGroup(directory=directory, codec=JSON)
    release_t, g_runs, release_g = threading.Event(), threading.Event(), threading.Event()
    runs: list[str] = []
    real_submit = DirectoryArbiter.submit

    def submit(self: DirectoryArbiter, key: str, **options: Any) -> Any:
        if self is scope_of(a) and options["fresh"] and key == "k":
            assert g_runs.wait(10)  # F's run goes once G leads t2
        return real_submit(self, key, **options)

    monkeypatch.setattr(DirectoryArbiter, "submit", submit)

    def work(name: str, started: threading.Event | None, release: threading.Event) -> Any:
        def body() -> str:
            runs.append(name)
            if started is not None:
                started.set()
            assert release.wait(15)
            return name

        return body

    try:
        coordinator = scope_of(a)._state.coordinator
        t = Background(lambda: a.run_sync("k", work("t", None, release_t)))
        wait_until(lambda: runs == ["t"], "t runs in a")
        f = Background(lambda: a.run_sync("k", work("F", None, release_g), fresh=True))
        fresh_waiting(a, "k", 1)
        g = Background(lambda: b.run_sync("k", work("G", g_runs, release_g), fresh=True))
        wait_until(lambda: len(coordinator._term.flights["k"].fresh) == 1, "G waits for t's end")
        release_t.set()
        assert t.wait().value == "t"
        assert g_runs.wait(10)
        wait_until(
            lambda: (fl := coordinator._term.flights.get("k")) is not None and len(fl.joiners) == 1,
            "F's run joined t2 (it waits for t2's end instead when it does not name t)",
        )
        release_g.set()
        g_result, f_result = g.wait(), f.wait()
        assert runs == ["t", "G"]
        assert (g_result.value, g_result.joined) == ("G", False)
        assert (f_result.value, f_result.joined, f_result.token) == ("G", True, g_result.token)
    finally:
        release_t.set()
        g_runs.set()
        release_g.set()
        close(a, b)


class Acquires:
    """The answers (kinds) Redis gave to ``of``'s ACQUIREs, in order."""

    def __init__(self, of: FlightGroup, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kinds: list[int] = []
        self.fail_first = threading.Event()  # set: the first ACQUIRE waits for `go`, fails
        self.go = threading.Event()
        self.reached = threading.Event()
        arbiter = fleet_of(of)
        real = RedisArbiter._script

        async def script(self_: RedisArbiter, name: str, keys: Sequence[str],
                         args: Sequence[Any]) -> Any:
            if self_ is arbiter and name == "acquire" and self.fail_first.is_set():
                self.fail_first.clear()
                self.reached.set()
                await asyncio.get_running_loop().run_in_executor(None, self.go.wait, 20)
                raise RedisConnectionError("cut for the test")
            reply = await real(self_, name, keys, args)
            if self_ is arbiter and name == "acquire":
                self.kinds.append(int(reply[0]))
            return reply

        monkeypatch.setattr(RedisArbiter, "_script", script)

    def wait(self, count: int) -> None:
        wait_until(lambda: len(self.kinds) >= count, f"{count} ACQUIREs answered")


@pytest.fixture
def fleet(redis_server: Any, namespace: str) -> Iterator[Callable[..., FlightGroup]]:
    made: list[FlightGroup] = []

    def make(lease: float = 5.0) -> FlightGroup:
        made.append(fleet_group(redis_server.url, namespace, lease=lease))
        return made[-1]

    try:
        yield make
    finally:
        close(*made)


def test_a_fresh_caller_after_a_flight_the_scope_never_answered_takes_no_older_flight(
    fleet: Callable[..., FlightGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh caller after a flight the scope never answered takes no older flight.

    b leads R. a's first caller asks Redis; its ACQUIRE is held, then fails (Redis
    unreachable for a moment): its local flight ends with UnavailableError under a's
    own local token (1), never a token of the namespace. A fresh caller of a came
    while it waited, so after R had begun: it does not get R's outcome. With
    after = 1 its ACQUIRE asks min_token 2, and R (a token of server microseconds)
    counts as a flight that began after its call."""
    a, b = fleet(), fleet()
    acquires = Acquires(a, monkeypatch)
    runs: list[str] = []
    r_started, release_r = threading.Event(), threading.Event()
    try:
        r = Background(lambda: b.run_sync("k", held(runs, "R", r_started, release_r)))
        assert r_started.wait(10)
        acquires.fail_first.set()
        first = Background(lambda: a.run_sync("k", never))
        assert acquires.reached.wait(10)
        fresh = Background(lambda: a.run_sync("k", ran(runs, "fresh"), fresh=True))
        fresh_waiting(a, "k", 1)
        acquires.go.set()
        with pytest.raises(UnavailableError):
            first.wait()
        acquires.wait(1)  # the fresh caller's ACQUIRE was answered (join, or wait for R)
        release_r.set()
        assert r.wait().value == "R"
        result = fresh.wait()
        assert (result.value, result.joined) == ("fresh", False), "R began before the call"
        assert runs == ["R", "fresh"]
    finally:
        acquires.go.set()
        release_r.set()


def test_a_fresh_caller_after_a_flight_that_lost_its_lease_takes_no_older_flight(
    fleet: Callable[..., FlightGroup], redis_server: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh caller after a flight that lost its lease takes no older flight.

    a leads F (token T) and stops renewing its lease, as a frozen process would: its
    record runs out and b leads R. Then a fresh caller of a comes: F's work still runs
    here, so it waits for F's end. F's landing is fenced (LeaseLostError): the flight
    ended in the scope long before it ended here, so T says nothing of what began
    after the fresh call, and the fresh caller never joins R, which began before it."""
    a, b = fleet(lease=1.0), fleet()
    acquires = Acquires(a, monkeypatch)
    runs: list[str] = []
    f_started, release_f = threading.Event(), threading.Event()
    r_started, release_r = threading.Event(), threading.Event()

    async def no_renewal(batch: Any) -> None:
        return None

    real_lose = fleet_of(a)._renewal.lose

    def unnoticed(lead: Any, reason: str) -> None:
        # Frozen, a process does not notice that its lease ran out (its flight would
        # leave its table then: ADR 0026); it notices when it runs again.
        if release_f.is_set():
            real_lose(lead, reason)

    def frozen() -> str:
        runs.append("F")
        fleet_of(a)._renewal.renew_some = no_renewal  # type: ignore[method-assign]
        fleet_of(a)._renewal.lose = unnoticed  # type: ignore[method-assign]
        f_started.set()
        assert release_f.wait(20)
        return "F"

    record = Names(namespace, "k", False).record
    client = redis_server.client()
    try:
        f = Background(lambda: a.run_sync("k", frozen))
        assert f_started.wait(10)
        wait_until(lambda: not client.exists(record), "F's record ran out")
        r = Background(lambda: b.run_sync("k", held(runs, "R", r_started, release_r)))
        assert r_started.wait(10)
        fresh = Background(lambda: a.run_sync("k", ran(runs, "fresh"), fresh=True))
        fresh_waiting(a, "k", 1)
        release_f.set()
        with pytest.raises(LeaseLostError):
            f.wait()
        acquires.wait(2)  # the fresh caller's ACQUIRE was answered (join, or wait for R)
        release_r.set()
        assert r.wait().value == "R"
        result = fresh.wait()
        assert (result.value, result.joined) == ("fresh", False), "R began before the call"
        assert runs == ["F", "R", "fresh"]
    finally:
        release_f.set()
        release_r.set()


@pytest.mark.parametrize("notice", ["late", "read"])
def test_a_fresh_caller_never_joins_a_flight_led_after_a_forget_before_its_call(
    fleet: Callable[..., FlightGroup], monkeypatch: pytest.MonkeyPatch, notice: str
) -> None:
    """A fresh caller never joins a flight led after a forget made before its call.

    b leads R; a's flight joins R. c forgets the key (R is parked, runs on) and
    leads R2. Then a fresh caller of a comes.

    late: a has not read the FORGET's notice yet (ADR 0026: a courtesy, it may come
    late), so a's flight (R) still runs here and the fresh caller waits for its end. R
    lands; the fresh caller leads a's next flight with after = R's token, and Redis
    has it wait for R2's end: R2's token is above R's, but R2 began before its call.
    read: the notice took R out of a's table: the fresh caller asks Redis at once,
    which has it wait for R2's end. Either way it leads the flight after R2."""
    a, b, c = fleet(), fleet(), fleet()
    acquires = Acquires(a, monkeypatch)
    if notice == "late":
        monkeypatch.setattr(FleetCall, "detached", lambda self: None)
    runs: list[str] = []
    r_started, release_r = threading.Event(), threading.Event()
    r2_started, release_r2 = threading.Event(), threading.Event()
    try:
        r = Background(lambda: b.run_sync("k", held(runs, "R", r_started, release_r)))
        assert r_started.wait(10)
        joiner = Background(lambda: a.run_sync("k", never))
        acquires.wait(1)
        assert acquires.kinds == [2]  # a's flight joined R
        c.forget("k")
        r2 = Background(lambda: c.run_sync("k", held(runs, "R2", r2_started, release_r2)))
        assert r2_started.wait(10)
        if notice == "read":
            wait_until(lambda: flight_of(a, "k") is None, "a read the notice")
        fresh = Background(lambda: a.run_sync("k", ran(runs, "fresh"), fresh=True))
        if notice == "late":
            fresh_waiting(a, "k", 1)  # it came once R2 ran
        else:
            acquires.wait(2)  # Redis answered: wait for R2's end
            assert acquires.kinds == [2, 4]
        release_r.set()
        assert r.wait().value == "R"
        assert joiner.wait().value == "R"
        acquires.wait(2)  # the fresh caller's ACQUIRE was answered (join, or wait for R2)
        release_r2.set()
        assert r2.wait().value == "R2"
        result = fresh.wait()
        assert (result.value, result.joined) == ("fresh", False), "R2 began before the call"
        assert runs == ["R", "R2", "fresh"]
    finally:
        release_r.set()
        release_r2.set()


def test_a_fresh_caller_that_comes_after_the_landing_never_joins_the_flight_begun_since(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh caller after the landing never joins a flight begun since.

    a leads F; a fresh caller of b waits at the coordinator for F's end. F's work
    returns and a hands its landing to the coordinator (held there, before a settles
    F in its own table): b's fresh caller leads R, whose work starts. Then a fresh
    caller of a comes: F still runs in a's table, so it waits for F's end. F settles
    here; the fresh caller leads a's next flight with after = F's token, and the
    coordinator never lets it join R, which began before its call."""
    a = coordinating(directory)
    b = group(directory)
    runs: list[str] = []
    f_started, release_f = threading.Event(), threading.Event()
    r_started, release_r = threading.Event(), threading.Event()
    landed, go = threading.Event(), threading.Event()
    real_land = DirectoryArbiter.land

    def land(self: DirectoryArbiter, call: Any, outcome: Any, *, done: Any, **rest: Any) -> None:
        def handed(answer: Any) -> None:  # taken by the coordinator, not settled here
            if self is scope_of(a) and call.key == "k":
                landed.set()
                # Told on a's own thread, which coordinates too: held in another one.
                threading.Thread(target=lambda: go.wait(20) and done(answer)).start()
                return
            done(answer)

        real_land(self, call, outcome, done=handed, **rest)

    monkeypatch.setattr(DirectoryArbiter, "land", land)
    try:
        coordinator = scope_of(a)._state.coordinator
        f = Background(lambda: a.run_sync("k", held(runs, "F", f_started, release_f)))
        assert f_started.wait(10)
        r = Background(lambda: b.run_sync("k", held(runs, "R", r_started, release_r),
                                          fresh=True))
        wait_until(lambda: len(coordinator._term.flights["k"].fresh) == 1, "b waits for F's end")
        release_f.set()
        assert landed.wait(10)
        assert r_started.wait(10)  # R runs: F landed at the coordinator
        fresh = Background(lambda: a.run_sync("k", ran(runs, "fresh"), fresh=True))
        fresh_waiting(a, "k", 1)  # F has not settled in a's table
        go.set()
        assert f.wait().value == "F"
        wait_until(
            lambda: (fl := coordinator._term.flights.get("k")) is not None
            and len(fl.joiners) + len(fl.fresh) == 1,
            "the fresh caller's run reached R (joined it, or waits for its end)",
        )
        release_r.set()
        assert r.wait().value == "R"
        result = fresh.wait()
        assert (result.value, result.joined) == ("fresh", False), "R began before the call"
        assert runs == ["F", "R", "fresh"]
    finally:
        go.set()
        release_f.set()
        release_r.set()
        close(b, a)


def test_a_promoted_caller_whose_flight_ended_before_its_claim_takes_its_outcome(
    wide: FlightGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A promoted caller whose flight ended before its claim takes its outcome.

    The promoted caller is woken (JOINED) and runs its on_join; its claim is held
    until the flight settled: it takes the outcome as a joiner (its work began after
    the call), counted once as a call and once as a join, and nothing is left."""
    g, runs, joined = wide, [], []
    lead_reached, lead_go = threading.Event(), threading.Event()
    claim_reached, claim_go = threading.Event(), threading.Event()
    real_lead, real_claim = Bridge._lead, FlightTable.claim

    def lead_wide(of: Bridge, *args: Any) -> Any:
        if of is bridge_of(g):
            lead_reached.set()
            assert lead_go.wait(20)
        return real_lead(of, *args)

    def claim(table: FlightTable, *args: Any, claimed: bool = True, **more: Any) -> Any:
        if table is table_of(g) and not claimed:
            claim_reached.set()
            assert claim_go.wait(20)
        return real_claim(table, *args, claimed=claimed, **more)

    monkeypatch.setattr(Bridge, "_lead", lead_wide)
    monkeypatch.setattr(FlightTable, "claim", claim)
    try:
        leader = Background(lambda: g.run_sync("k", ran(runs, "first")))
        assert lead_reached.wait(10)
        fresh = Background(
            lambda: g.run_sync("k", ran(runs, "fresh"), fresh=True,
                               on_join=lambda: joined.append(1))
        )
        fresh_waiting(g, "k", 1)
        lead_go.set()
        assert claim_reached.wait(10)
        assert joined == [1]  # before it joins
        first = leader.wait()
        claim_go.set()
        result = fresh.wait()
    finally:
        lead_go.set()
        claim_go.set()
    assert (first.value, first.joined) == ("first", False)
    assert (result.value, result.joined, result.token) == ("first", True, first.token)
    assert runs == ["first"] and joined == [1]
    stats = g.stats()
    assert (stats.calls, stats.joins, stats.flights, stats.in_flight) == (2, 1, 1, 0)
    assert flight_of(g, "k") is None


def test_a_fresh_caller_of_the_leaders_process_never_joins_a_flight_led_after_a_forget(
    fleet: Callable[..., FlightGroup],
) -> None:
    """A fresh caller in the leader's process never joins a flight led after a forget.

    a leads R. c forgets the key (R runs on, parked) and leads R2. Then a fresh
    caller of a comes: R still runs in a's table, so it waits for R's end, and its
    request names R's token. R2's token is above R's, but R2 began before the call:
    the fresh caller must wait for R2's end and lead, not join R2. (The directory
    scope cannot get here: R2's leader waits for R's key lock, which R keeps until
    its landing was acknowledged, so R2 begins after every call that saw R run.)"""
    a, c = fleet(), fleet()
    runs: list[str] = []
    r_started, release_r = threading.Event(), threading.Event()
    r2_started, release_r2 = threading.Event(), threading.Event()
    try:
        r = Background(lambda: a.run_sync("k", held(runs, "R", r_started, release_r)))
        assert r_started.wait(10)
        c.forget("k")
        r2 = Background(lambda: c.run_sync("k", held(runs, "R2", r2_started, release_r2)))
        assert r2_started.wait(10)
        fresh = Background(lambda: a.run_sync("k", ran(runs, "fresh"), fresh=True))
        fresh_waiting(a, "k", 1)  # it came once R2 ran
        release_r.set()
        assert r.wait().value == "R"
        release_r2.set()
        assert r2.wait().value == "R2"
        result = fresh.wait()
        assert (result.value, result.joined) == ("fresh", False), "R2 began before the call"
        assert runs == ["R", "R2", "fresh"]
    finally:
        release_r.set()
        release_r2.set()
