"""A review of 862c027 (fresh callers in the wide scopes, ADR 0005's last section).

``fresh=True`` accepts only a flight that starts after the call (API.md). The commit
lets fresh callers that waited here for the end of a flight of token T take any flight
of the scope whose token is above T (``after``). Every order below is forced by events
and patched hooks; ``wait_until`` only waits for a state other threads drive towards.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from flightgroup import FlightGroup, LeaseLostError, UnavailableError
from flightgroup.directory.client import DirectoryArbiter
from flightgroup.engine.table import FlightTable
from flightgroup.redis.arbiter import FleetCall, RedisArbiter, _Names
from flightgroup.scope.bridge import Bridge

from .infleet import fleet_group, fleet_of, never
from .infresh import fresh_waiting, held, ran
from .ingroup import Background, close, coordinating, group
from .support import wait_until

pytestmark = pytest.mark.timeout(60)


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


# -- `after` taken from a token that is not the scope's --------------------------------


def test_a_fresh_caller_after_a_flight_the_scope_never_answered_takes_no_older_flight(
    fleet: Callable[..., FlightGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    """b leads R. a's first caller asks Redis; its ACQUIRE is held, then fails (Redis
    unreachable for a moment): its local flight ends with UnavailableError under a's
    own local token (1), never a token of the namespace. A fresh caller of a came
    while it waited, so after R had begun: it must not get R's outcome. With
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
    """a leads F (token T) and stops renewing its lease, as a frozen process would: its
    record runs out and b leads R. Then a fresh caller of a comes: F's work still runs
    here, so it waits for F's end. F's landing is fenced (LeaseLostError): the flight
    ended in the scope long before it ended here, so T says nothing of what began
    after the fresh call; with after = T it joined R, which began before it."""
    a, b = fleet(lease=1.0), fleet()
    acquires = Acquires(a, monkeypatch)
    runs: list[str] = []
    f_started, release_f = threading.Event(), threading.Event()
    r_started, release_r = threading.Event(), threading.Event()

    async def no_renewal(batch: Any) -> None:
        return None

    real_lose = fleet_of(a)._lose

    def unnoticed(lead: Any, reason: str) -> None:
        # Frozen, a process does not notice that its lease ran out (its flight would
        # leave its table then: ADR 0026); it notices when it runs again.
        if release_f.is_set():
            real_lose(lead, reason)

    def frozen() -> str:
        runs.append("F")
        fleet_of(a)._renew_some = no_renewal  # type: ignore[method-assign]
        fleet_of(a)._lose = unnoticed  # type: ignore[method-assign]
        f_started.set()
        assert release_f.wait(20)
        return "F"

    record = _Names(namespace, "k", False).record
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


# -- `after` names a flight; a newer one may have begun before the fresh call -----------


@pytest.mark.parametrize("notice", ["late", "read"])
def test_a_fresh_caller_never_joins_a_flight_led_after_a_forget_before_its_call(
    fleet: Callable[..., FlightGroup], monkeypatch: pytest.MonkeyPatch, notice: str
) -> None:
    """b leads R; a's flight joins R. c forgets the key (R is parked, runs on) and
    leads R2. Then a fresh caller of a comes.

    late: a has not read the FORGET's notice yet (ADR 0026: a courtesy, it may come
    late), so a's flight (R) still runs here and the fresh caller waits for its end. R
    lands; the fresh caller leads a's next flight with after = R's token, and Redis
    lets it join R2 (token above R's), a flight that began before its call (before
    862c027 it waited for R2's end and led one more).
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
            wait_until(lambda: "k" not in a._table.flights, "a read the notice")
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
    """a leads F; a fresh caller of b waits at the coordinator for F's end. F's work
    returns and a hands its landing to the coordinator (held there, before a settles
    F in its own table): b's fresh caller leads R, whose work starts. Then a fresh
    caller of a comes: F still runs in a's table, so it waits for F's end. F settles
    here; the fresh caller leads a's next flight with after = F's token and the
    coordinator lets it join R, which began before its call."""
    a = coordinating(directory)
    b = group(directory)
    runs: list[str] = []
    f_started, release_f = threading.Event(), threading.Event()
    r_started, release_r = threading.Event(), threading.Event()
    landed, go = threading.Event(), threading.Event()
    real_land = DirectoryArbiter.land

    def land(self: DirectoryArbiter, call: Any, outcome: Any, *, done: Any, **rest: Any) -> None:
        def handed(answer: Any) -> None:  # handed to the coordinator, not settled here
            if self is a._scope and call.key == "k":
                landed.set()
                assert go.wait(20)
            done(answer)

        real_land(self, call, outcome, done=handed, **rest)

    monkeypatch.setattr(DirectoryArbiter, "land", land)
    try:
        coordinator = a._scope._coordinator  # type: ignore[union-attr]
        f = Background(lambda: a.run_sync("k", held(runs, "F", f_started, release_f)))
        assert f_started.wait(10)
        r = Background(lambda: b.run_sync("k", held(runs, "R", r_started, release_r),
                                          fresh=True))
        wait_until(lambda: len(coordinator._flights["k"].fresh) == 1, "b waits for F's end")
        release_f.set()
        assert landed.wait(10)
        assert r_started.wait(10)  # R runs: F landed at the coordinator
        fresh = Background(lambda: a.run_sync("k", ran(runs, "fresh"), fresh=True))
        fresh_waiting(a, "k", 1)  # F has not settled in a's table
        go.set()
        assert f.wait().value == "F"
        wait_until(
            lambda: (fl := coordinator._flights.get("k")) is not None
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


# -- pins: what was checked and found right --------------------------------------------


def test_a_promoted_caller_whose_flight_ended_before_its_claim_takes_its_outcome(
    wide: FlightGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The promoted caller is woken (JOINED) and runs its on_join; its claim is held
    until the flight settled: it takes the outcome as a joiner (its work began after
    the call), counted once as a call and once as a join, and nothing is left."""
    g, runs, joined = wide, [], []
    lead_reached, lead_go = threading.Event(), threading.Event()
    claim_reached, claim_go = threading.Event(), threading.Event()
    real_lead, real_claim = Bridge._lead, FlightTable.claim

    def lead_wide(of: Bridge, *args: Any) -> Any:
        if of is g._bridge:
            lead_reached.set()
            assert lead_go.wait(20)
        return real_lead(of, *args)

    def claim(table: FlightTable, *args: Any, claimed: bool = True, **more: Any) -> Any:
        if table is g._table and not claimed:
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
    assert "k" not in g._table.flights


def test_a_fresh_caller_of_the_leaders_process_never_joins_a_flight_led_after_a_forget(
    fleet: Callable[..., FlightGroup],
) -> None:
    """a leads R. c forgets the key (R runs on, parked) and leads R2. Then a fresh
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
