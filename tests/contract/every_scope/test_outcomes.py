"""docs/api.md, Outcomes: every row, over every scope (the joiner in the leader's own group,
and, in a wide scope, in another "process")."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightFailedError,
    FlightGroup,
    FlightInterruptedError,
    FlightTimeoutError,
    GroupClosedError,
    LeaseLostError,
    ValueTooLargeError,
    current_lease,
)

from ...ingroup import Background
from ...support import LoopThread, hanging_works, run, wait_until
from .conftest import Leader, Scope, joiner, lose_lease, raised


class Stop(BaseException):
    """A BaseException that is not an Exception (as KeyboardInterrupt is)."""


# -- the work returned v ------------------------------------------------------------


def test_the_leader_and_a_joiner_get_the_value(scope: Scope, group: FlightGroup) -> None:
    made = [1, 2]
    leader = Leader(group, "k", made)
    waiting = joiner(group, "k")
    leader.release()
    led, joined = leader.result(), waiting.wait()
    assert (led.value, led.joined) == ([1, 2], False)
    assert (joined.value, joined.joined, joined.token) == ([1, 2], True, led.token)
    # Process scope: the very object; a wide scope: decode(encode(v)), a copy each.
    assert (joined.value is made) is scope.expect.same_object
    assert (led.value is made) is scope.expect.same_object


def test_every_caller_gets_decode_of_encode_of_the_value(scope: Scope) -> None:
    g = scope.group(codec=JSON)  # the process scope too, once it has a codec
    leader = Leader(g, "k", (1, "a"))
    waiting = joiner(g, "k")
    leader.release()
    assert leader.result().value == [1, "a"]  # JSON: a tuple comes back as a list
    assert waiting.wait().value == [1, "a"]


def test_a_joiner_elsewhere_gets_the_value_as_a_joiner(pair: tuple[FlightGroup, ...]) -> None:
    a, b = pair
    leader = Leader(a, "k", {"n": 1})
    waiting = joiner(b, "k")
    leader.release()
    led, joined = leader.result(), waiting.wait()
    assert (joined.value, joined.joined, joined.token) == ({"n": 1}, True, led.token)
    assert joined.value is not led.value  # each process decodes its own


def test_async_and_sync_callers_share_one_flight(scope: Scope, group: FlightGroup) -> None:
    leader = Leader(group, "k", "v")
    joined = threading.Event()

    async def call() -> Any:
        return await group.run("k", never_async, on_join=joined.set)


    loop = LoopThread()
    try:
        future = loop.submit(call())
        assert joined.wait(15)
        leader.release()
        result = future.result(15)
    finally:
        loop.close()
    assert (result.value, result.joined) == ("v", True)
    assert leader.runs == 1


async def never_async() -> Any:
    raise AssertionError("a joiner's work never runs")


# -- the work raised E ----------------------------------------------------------------


def test_the_leader_raises_the_works_error_and_joiners_get_flight_failed_error(
    group: FlightGroup,
) -> None:
    error = KeyError("gone")
    leader = Leader(group, "k", error=error)
    waiting = joiner(group, "k")
    leader.release()
    assert raised(leader.call) is error
    failed = raised(waiting)
    assert isinstance(failed, FlightFailedError)
    assert (failed.key, failed.error_type, failed.error_module) == ("k", "KeyError", "builtins")
    assert failed.message == str(error)
    assert failed.__cause__ is error  # in the same process


def test_a_joiner_elsewhere_gets_flight_failed_error(pair: tuple[FlightGroup, ...]) -> None:
    a, b = pair
    leader = Leader(a, "k", error=ValueError("bad input"))
    waiting = joiner(b, "k")
    leader.release()
    assert isinstance(raised(leader.call), ValueError)
    failed = raised(waiting)
    assert isinstance(failed, FlightFailedError)
    assert (failed.error_type, failed.error_module, failed.message) == (
        "ValueError", "builtins", "bad input"
    )


def test_a_failed_flight_leaves_nothing_behind(group: FlightGroup) -> None:
    with pytest.raises(ValueError):
        group.run_sync("k", _raise(ValueError("once")))
    again = group.run_sync("k", lambda: "second")
    assert (again.value, again.joined) == ("second", False)


def _raise(error: BaseException) -> Any:
    def work() -> Any:
        raise error

    return work


# -- a BaseException that is not an Exception -----------------------------------------


def test_a_base_exception_reaches_the_leader_and_interrupts_the_joiners(
    group: FlightGroup,
) -> None:
    stop = Stop()
    leader = Leader(group, "k", error=stop)
    waiting = joiner(group, "k")
    leader.release()
    assert raised(leader.call) is stop
    assert isinstance(raised(waiting), FlightInterruptedError)


def test_a_cancelled_work_interrupts_a_joiner_elsewhere(pair: tuple[FlightGroup, ...]) -> None:
    a, b = pair
    leader = Leader(a, "k", error=Stop())
    waiting = joiner(b, "k")
    leader.release()
    assert isinstance(raised(leader.call), Stop)
    interrupted = raised(waiting)
    assert isinstance(interrupted, FlightInterruptedError) and interrupted.key == "k"


# -- the deadline -------------------------------------------------------------------


def test_an_attempt_past_its_deadline_times_out_for_every_caller(scope: Scope) -> None:
    g = scope.group(deadline=0.2)
    never_ends = asyncio.Event()
    joined = asyncio.Event()

    async def work() -> None:
        await never_ends.wait()  # a deadline stops an async work

    async def both() -> list[Any]:
        async def join() -> Any:
            while not g.stats().in_flight:
                await asyncio.sleep(0)
            return await g.run("k", never_async, on_join=joined.set)

        return await asyncio.gather(g.run("k", work), join(), return_exceptions=True)

    led, joined_error = run(both())
    for error in (led, joined_error):
        assert isinstance(error, FlightTimeoutError)
        assert (error.key, error.deadline, error.attempts) == ("k", 0.2, 1)


def test_a_joiner_elsewhere_times_out_with_the_leader(wide: Scope) -> None:
    a, b = wide.group(deadline=0.3), wide.group()
    started = threading.Event()

    def work() -> None:
        started.set()
        threading.Event().wait(5)  # a sync work runs on past its deadline


    leader = Background(lambda: a.run_sync("k", work))
    assert started.wait(15)
    waiting = joiner(b, "k")
    assert isinstance(raised(leader), FlightTimeoutError)
    timed_out = raised(waiting)
    assert isinstance(timed_out, FlightTimeoutError) and timed_out.deadline == 0.3
    # the attempts its flight made, where the scope carries them
    assert timed_out.attempts == (1 if wide.expect.attempts_elsewhere else None)


def test_a_sync_work_left_past_its_deadline_is_counted_until_it_returns(scope: Scope) -> None:
    """A sync work left past its deadline counts in stats().left_threads until it returns,
    and over max_deadline_threads an attempt times out without running, in every scope."""
    g = scope.group(deadline=0.1, max_deadline_threads=1)
    release = threading.Event()
    ran: list[str] = []

    hangs = hanging_works(ran, release)

    try:
        with pytest.raises(FlightTimeoutError):
            g.run_sync("a", hangs("a"))
        assert g.stats().left_threads == 1
        with pytest.raises(FlightTimeoutError) as refused:
            g.run_sync("b", hangs("b"))
        assert refused.value.max_deadline_threads == 1 and ran == ["a"]
        release.set()
        wait_until(lambda: g.stats().left_threads == 0, "the left work returned")
        assert g.run_sync("b", lambda: "v").value == "v"
    finally:
        release.set()


# -- a lost lease -----------------------------------------------------------------------


def test_a_leader_that_lost_its_lease_raises_lease_lost_and_its_joiners_are_interrupted(
    losable: Scope,
) -> None:
    a, b = losable.pair()
    heard = threading.Event()

    def work() -> str:
        lease = current_lease()
        started.set()
        while not lease.lost:  # the scope tells the work (lease.lost, wait_lost)
            heard.wait(0.01)
        heard.set()
        raise RuntimeError("stopped: the lease is lost")


    started = threading.Event()
    leader = Background(lambda: a.run_sync("k", work))
    assert started.wait(15)
    here, elsewhere = joiner(a, "k"), joiner(b, "k")
    lose_lease(losable, "k")
    lost = raised(leader)
    assert heard.is_set()
    assert isinstance(lost, LeaseLostError) and lost.key == "k"
    assert isinstance(lost.__cause__, RuntimeError)  # the work's own error
    assert isinstance(raised(here), FlightInterruptedError)
    assert isinstance(raised(elsewhere), FlightInterruptedError)
    assert a.run_sync("k", lambda: "next").value == "next"  # the key is free again


# -- the codec: encode, size, decode ------------------------------------------------------


def test_an_encode_failure_reaches_the_leader_and_fails_the_joiners(scope: Scope) -> None:
    a = scope.group(codec=JSON)
    leader = Leader(a, "k", object())  # JSON cannot encode it
    waiting = joiner(a, "k")
    leader.release()
    assert isinstance(raised(leader.call), TypeError)
    failed = raised(waiting)
    assert isinstance(failed, FlightFailedError) and failed.error_type == "TypeError"


def test_an_encode_failure_fails_a_joiner_elsewhere(wide: Scope) -> None:
    a, b = wide.pair()
    leader = Leader(a, "k", {1, 2})  # JSON cannot encode a set
    waiting = joiner(b, "k")
    leader.release()
    assert isinstance(raised(leader.call), TypeError)
    failed = raised(waiting)
    assert isinstance(failed, FlightFailedError) and failed.error_type == "TypeError"


def test_an_outcome_over_max_value_bytes_raises_value_too_large_for_the_leader(
    scope: Scope,
) -> None:
    g = scope.group(codec=JSON, max_value_bytes=16)
    leader = Leader(g, "k", "x" * 40)  # 42 bytes encoded
    waiting = joiner(g, "k")
    leader.release()
    too_large = raised(leader.call)
    assert isinstance(too_large, ValueTooLargeError)
    assert (too_large.key, too_large.size, too_large.limit) == ("k", 42, 16)
    failed = raised(waiting)
    assert isinstance(failed, FlightFailedError) and failed.error_type == "ValueTooLargeError"


def test_a_joiner_elsewhere_of_a_value_too_large_gets_flight_failed_error(wide: Scope) -> None:
    a, b = wide.group(max_value_bytes=16), wide.group()
    leader = Leader(a, "k", "x" * 40)
    waiting = joiner(b, "k")
    leader.release()
    assert isinstance(raised(leader.call), ValueTooLargeError)
    failed = raised(waiting)
    assert isinstance(failed, FlightFailedError) and failed.error_type == "ValueTooLargeError"


class FailsOnce:
    """JSON, whose first decode raises: one caller alone gets the error."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed = False

    def encode(self, value: Any) -> bytes:
        return json.dumps(value).encode()

    def decode(self, data: bytes) -> Any:
        with self.lock:
            first, self.failed = not self.failed, True
        if first:
            raise ValueError("cannot decode")
        return json.loads(data)


def test_a_decode_failure_fails_only_that_caller(scope: Scope) -> None:
    g = scope.group(codec=FailsOnce())
    leader = Leader(g, "k", "v")
    waiting = [joiner(g, "k") for _ in range(2)]
    leader.release()
    calls = [leader.call, *waiting]
    for each in calls:
        each.done.wait(15)
    errors = [each.error for each in calls if each.error is not None]
    values = [each.result.value for each in calls if each.error is None]
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    assert values == ["v", "v"]


# -- a closed group --------------------------------------------------------------------


def test_a_closed_group_rejects_every_call(group: FlightGroup) -> None:
    group.close()
    with pytest.raises(GroupClosedError, match=r"^This flight group is closed\.$"):
        group.run_sync("k", lambda: 1)
    with pytest.raises(GroupClosedError):
        run(group.run("k", never_async))
    with pytest.raises(GroupClosedError):
        group.forget("k")
