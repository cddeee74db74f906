"""The contract suite over every scope: one behaviour, written once, run over each.

A package of its own inside tests/contract/, so that its ``wide`` and ``pair`` fixtures
(which include the fake scope) do not shadow tests/conftest.py's for the other contract
tests, which drive the real scopes' internals.

``scope`` is parametrized with ids ``process``, ``fake``, ``directory`` and ``fleet``;
``group`` is one group of it. ``pair`` gives two groups of one wide scope (two
"processes"): it runs over ``fake``, ``directory`` and ``fleet`` only, because in the
process scope two groups share nothing, so every pair test would be meaningless there.

Where the scopes differ, the difference is stated once, in :data:`EXPECT`, and the
tests read it; no test branches on the scope's id. Concurrency is forced with events
(a leader's work blocks until released; a joiner is known to have joined when its
``on_join`` ran), never with a sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from flightgroup import FlightGroup
from flightgroup.testing import FakeCoordinator

from ...ingroup import Background, scope_groups

ALL = ["process", "fake", "directory", "fleet"]
WIDE = ["fake", "directory", "fleet"]
# The scopes where a test can take a running leader's lease away (the fake by its hook,
# the fleet by deleting the flight's record: its next renewal is refused). The directory
# loses a lease only to a coordinator that rejects it or stays away past
# reconnect_timeout, which this suite does not stage (tests/directory/ does).
LEASE_LOSABLE = ["fake", "fleet"]
LEASE = 1.0  # s: a fleet group's lease here (renewed every third of it)


@dataclass(frozen=True)
class Expect:
    """How one scope keeps the contract where scopes differ (docs/api.md)."""

    # A joiner gets the very object the work returned (process scope, no codec), not
    # its own decoded copy.
    same_object: bool
    # A group spans "processes": a pair of groups shares flights.
    wide: bool
    # Kept outcomes expire by a clock the test moves (the fake's), not by waiting.
    fake_clock: bool
    # A flight that left its key (forgotten, its group closed) holds the key while its
    # work runs: the next call leads only once that work ended (the directory's key
    # lock: no two runs of a key at once); else the next call leads beside it.
    left_holds_key: bool
    # A joiner elsewhere hears how many attempts a flight that timed out made (the
    # fleet's mailbox carries only the deadline).
    attempts_elsewhere: bool = True


EXPECT = {
    "process": Expect(same_object=True, wide=False, fake_clock=False, left_holds_key=False),
    "fake": Expect(same_object=False, wide=True, fake_clock=True, left_holds_key=False),
    "directory": Expect(same_object=False, wide=True, fake_clock=False, left_holds_key=True),
    "fleet": Expect(
        same_object=False,
        wide=True,
        fake_clock=False,
        left_holds_key=False,
        attempts_elsewhere=False,
    ),
}


class Scope:
    """One scope under test: makes its groups (closed at the test's end) and knows
    how it differs (``expect``)."""

    def __init__(self, request: pytest.FixtureRequest, id: str) -> None:
        self.id = id
        self.expect = EXPECT[id]
        self.fake = FakeCoordinator() if id == "fake" else None
        self._request = request
        self._made: list[FlightGroup] = []

    def group(self, **options: Any) -> FlightGroup:
        """A new group of this scope (another "process" of the same group, in a wide
        scope), made with ``options`` (a wide scope's codec is JSON unless given)."""
        [made] = scope_groups(self._request, self.id, 1, LEASE, self.fake, **options)
        self._made.append(made)
        return made

    def pair(self, **options: Any) -> tuple[FlightGroup, FlightGroup]:
        """Two "processes" of this (wide) scope."""
        return self.group(**options), self.group(**options)

    def expire(self, seconds: float) -> None:
        """Let ``seconds`` pass for kept outcomes: the fake's clock moves; the other
        scopes' clocks are real, so the test waits them out (kept for short TTLs only)."""
        if self.fake is not None:
            self.fake.advance(seconds)
        else:
            time.sleep(seconds)

    def close(self) -> None:
        for made in self._made:
            closer = threading.Thread(target=made.close, daemon=True)
            closer.start()
            closer.join(15)


def _scope(request: pytest.FixtureRequest) -> Iterator[Scope]:
    # A wide scope's server and place first: they are torn down after its groups close.
    for name in {"directory": ["directory"], "fleet": ["redis_server", "namespace"]}.get(
        request.param, []
    ):
        request.getfixturevalue(name)
    made = Scope(request, request.param)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=ALL)
def scope(request: pytest.FixtureRequest) -> Iterator[Scope]:
    """Each scope: process, fake, directory, fleet."""
    yield from _scope(request)


@pytest.fixture(params=WIDE)
def wide(request: pytest.FixtureRequest) -> Iterator[Scope]:
    """Each wide scope (a pair of its groups is two "processes")."""
    yield from _scope(request)


@pytest.fixture(params=LEASE_LOSABLE)
def losable(request: pytest.FixtureRequest) -> Iterator[Scope]:
    """Each scope where the test can take a running lead's lease (see LEASE_LOSABLE)."""
    yield from _scope(request)


@pytest.fixture
def group(scope: Scope) -> FlightGroup:
    """One group of each scope."""
    return scope.group()


@pytest.fixture
def pair(wide: Scope) -> tuple[FlightGroup, FlightGroup]:
    """Two groups of each wide scope: two "processes" of one group."""
    return wide.pair()


def lose_lease(scope: Scope, key: str) -> None:
    """Take the lease of ``key``'s running lead away (a scope of LEASE_LOSABLE)."""
    if scope.fake is not None:
        scope.fake.lose_lease(key)
        return
    assert scope.id == "fleet"
    client = scope._request.getfixturevalue("redis_server").client()
    namespace = scope._request.getfixturevalue("namespace")
    try:
        records = list(client.scan_iter(match=f"fg:{{{namespace}:*"))
        assert records, "the flight's record"
        client.delete(*records)  # its next renewal finds no flight: the lease is lost
    finally:
        client.close()


# -- forcing the interleaving -------------------------------------------------------


class Leader:
    """A leading call on a thread of its own whose work runs until ``release()``:
    then it returns ``value`` (or raises ``error``). Built once its work runs."""

    def __init__(
        self,
        g: FlightGroup,
        key: str,
        value: Any = "v",
        *,
        error: BaseException | None = None,
        before: Callable[[], Any] | None = None,
        **call: Any,
    ) -> None:
        self.started = threading.Event()
        self._release = threading.Event()
        self.runs = 0

        def work() -> Any:
            self.runs += 1
            self.started.set()
            assert self._release.wait(30), "the test never released the work"
            if before is not None:
                before()
            if error is not None:
                raise error
            return value

        self.work = work
        self.call = Background(lambda: g.run_sync(key, work, **call), name=f"leader-{key}")
        assert self.started.wait(15), "the leader's work never started"

    def release(self) -> None:
        self._release.set()

    def result(self) -> Any:
        return self.call.wait()


def never() -> Any:
    raise AssertionError("a joiner's work never runs")


def joiner(g: FlightGroup, key: str, **call: Any) -> Background:
    """A call of ``key`` on a thread of its own, returned once it joined the running
    flight (its on_join ran)."""
    joined = threading.Event()
    made = Background(lambda: g.run_sync(key, never, on_join=joined.set, **call))
    assert joined.wait(15) or made.done.is_set(), "the call never joined"
    if made.error is not None and not joined.is_set():
        raise made.error
    return made


def raised(background: Background) -> BaseException:
    """The exception ``background``'s call ended with (it must have raised)."""
    assert background.done.wait(15), "the call did not end"
    assert background.error is not None, f"returned {background.result!r}"
    return background.error
