"""docs/api.md, Outcomes and Policies: Limits are each process's own and count per process
(``max_waiters``: joiners waiting here; ``max_flights``: flights led or waited for here)."""

from __future__ import annotations

import threading

import pytest

from flightgroup import JSON, Limits, TooManyFlightsError, TooManyWaitersError
from flightgroup.testing import FakeCoordinator

from ...ingroup import Background
from ...support import LoopThread, wait_until
from .conftest import Leader, Scope, joiner, never, raised


def test_a_joiner_past_max_waiters_raises_too_many_waiters(scope: Scope) -> None:
    g = scope.group(limits=Limits(max_waiters=1))
    leader = Leader(g, "k", "v")
    first = joiner(g, "k")
    with pytest.raises(TooManyWaitersError) as caught:
        g.run_sync("k", never)
    assert (caught.value.key, caught.value.limit) == ("k", 1)
    leader.release()
    assert (leader.result().value, first.wait().value) == ("v", "v")


def test_a_new_key_past_max_flights_raises_too_many_flights(scope: Scope) -> None:
    g = scope.group(limits=Limits(max_flights=1))
    leader = Leader(g, "a", "v")
    with pytest.raises(TooManyFlightsError) as caught:
        g.run_sync("b", never)
    assert (caught.value.key, caught.value.limit) == ("b", 1)
    assert joiner(g, "a") is not None  # a running key is no new flight
    leader.release()
    assert leader.result().value == "v"
    assert g.run_sync("b", lambda: "b").value == "b"  # room again


def test_limits_count_per_process(wide: Scope) -> None:
    a = wide.group(limits=Limits(max_waiters=1, max_flights=1))
    b = wide.group(limits=Limits(max_waiters=1, max_flights=2))
    leader = Leader(a, "k", "v")
    here = joiner(a, "k")  # a is at its limit
    with pytest.raises(TooManyWaitersError):
        a.run_sync("k", never)
    elsewhere = joiner(b, "k")  # b's waiters are b's own
    with pytest.raises(TooManyFlightsError):
        a.run_sync("other", never)  # a waits for one flight: its limit
    assert b.run_sync("other", lambda: "o").value == "o"  # b waits for one: room for one
    leader.release()
    assert (here.wait().value, elsewhere.wait().value) == ("v", "v")


@pytest.mark.parametrize("first_call", ["sync", "async"])
def test_max_waiters_counts_every_joiner_waiting_in_the_process(
    wide: Scope, first_call: str
) -> None:
    """A process's first caller of a flight led elsewhere is a joiner: it counts."""
    a, b = wide.group(), wide.group(limits=Limits(max_waiters=2))
    leader = Leader(a, "k", "v")
    loop = LoopThread()
    try:
        if first_call == "sync":
            first = joiner(b, "k")  # b's first caller: it asked the scope, and joined
        else:
            joined = threading.Event()
            first_future = loop.submit(b.run("k", never, on_join=joined.set))
            assert joined.wait(15), "b's first caller never joined"
        second = joiner(b, "k")  # two joiners wait in b: its limit
        with pytest.raises(TooManyWaitersError) as caught:
            b.run_sync("k", never, timeout=5)
        assert (caught.value.key, caught.value.limit) == ("k", 2)
        leader.release()
        firsts = first.wait() if first_call == "sync" else first_future.result(15)
        assert [firsts.joined, second.wait().joined] == [True, True]
        assert leader.result().value == "v"
    finally:
        leader.release()
        loop.close()


def test_a_first_caller_the_scope_has_not_answered_counts_as_a_joiner() -> None:
    """Before the scope answers, the first caller counts; admitted callers stay."""
    fake = FakeCoordinator()
    a, b = fake.group(codec=JSON), fake.group(codec=JSON, limits=Limits(max_waiters=2))
    try:
        leader = Leader(a, "k", "v")
        with fake.hold("k"):  # b's first caller asks, and hears nothing yet
            first = Background(lambda: b.run_sync("k", never))
            wait_until(lambda: b.stats().calls == 1, "b's first caller arrived")
            second = Background(lambda: b.run_sync("k", never))
            wait_until(lambda: b.stats().joins == 1, "b's second caller joined")
            with pytest.raises(TooManyWaitersError):  # the first one counts already
                b.run_sync("k", never, timeout=5)
        # Joined: both b's callers are joiners of a's flight, at b's limit, not failed.
        with pytest.raises(TooManyWaitersError):
            b.run_sync("k", never, timeout=5)
        leader.release()
        assert [first.wait().joined, second.wait().joined] == [True, True]
        # Lead: once the work runs here, its leading caller counts no longer.
        release, calls, joins = threading.Event(), b.stats().calls, b.stats().joins
        with fake.hold("j"):
            led = Background(lambda: b.run_sync("j", lambda: release.wait(15) and "w"))
            wait_until(lambda: b.stats().calls == calls + 1, "b's caller of j arrived")
            waiting = Background(lambda: b.run_sync("j", never))
            wait_until(lambda: b.stats().joins == joins + 1, "a caller joined b's j")
            with pytest.raises(TooManyWaitersError):
                b.run_sync("j", never, timeout=5)
        # (the held Lead was answered as the block ended: the work runs here now)
        wait_until(lambda: b.stats().flights == 1, "j runs in b")
        also = joiner(b, "j")
        release.set()
        assert (led.wait().joined, waiting.wait().joined, also.wait().joined) == (
            False,
            True,
            True,
        )
    finally:
        a.close()
        b.close()


def test_a_leading_caller_that_stopped_waiting_no_longer_counts(wide: Scope) -> None:
    """A process's first caller that timed out leaves room for another joiner."""
    a, b = wide.group(), wide.group(limits=Limits(max_waiters=1))
    leader = Leader(a, "k", "v")
    try:
        gave_up = Background(lambda: b.run_sync("k", never, timeout=0.5))
        assert isinstance(raised(gave_up), TimeoutError)  # the flight runs on in b
        later = joiner(b, "k")  # the one place is free again
        with pytest.raises(TooManyWaitersError):
            b.run_sync("k", never, timeout=5)
        leader.release()
        assert later.wait().value == "v"
    finally:
        leader.release()
