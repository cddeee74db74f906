"""The fake scope's hooks (flightgroup.testing, ADR 0034): what real scopes suffer, each
forced at a point the test chooses. They pin the contract rows a test cannot stage on a
real scope in one process (a leader's death, an unreachable scope, a late answer), and
that the engine copes with a scope that answers at once, in the caller's own thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
    GroupClosedError,
    LeaseLostError,
    Retention,
    Retry,
    UnavailableError,
    current_lease,
)
from flightgroup.scope.events import Joined, Landed
from flightgroup.testing import FakeCoordinator, FakeScope

from ...ingroup import Background
from ...support import run, wait_until
from .conftest import Leader, joiner, never, raised


@pytest.fixture
def fake() -> FakeCoordinator:
    return FakeCoordinator()


@pytest.fixture
def made(fake: FakeCoordinator) -> list[FlightGroup]:
    groups = [fake.group(codec=JSON) for _ in range(2)]
    yield groups  # type: ignore[misc]
    for each in groups:
        each.close()


def test_a_joiner_elsewhere_of_a_leader_whose_process_died_is_interrupted(
    fake: FakeCoordinator, made: list[FlightGroup]
) -> None:
    a, b = made
    leader = Leader(a, "k", "v")
    elsewhere = joiner(b, "k")
    fake.kill(a)
    interrupted = raised(elsewhere)
    assert isinstance(interrupted, FlightInterruptedError) and "died" in str(interrupted)
    assert b.run_sync("k", lambda: "b leads").value == "b leads"  # the key is free
    leader.release()
    assert isinstance(raised(leader.call), LeaseLostError)  # its landing is refused
    with pytest.raises(UnavailableError):
        a.run_sync("k2", never)  # a dead process calls no more


def test_an_unreachable_scope_fails_calls_fast_and_serves_again_when_back(
    fake: FakeCoordinator, made: list[FlightGroup]
) -> None:
    a, _ = made
    fake.unreachable(True)
    with pytest.raises(UnavailableError) as caught:
        a.run_sync("k", never)
    assert caught.value.key == "k"
    with pytest.raises(UnavailableError):
        a.forget("k")
    fake.unreachable(False)
    assert a.run_sync("k", lambda: 1).value == 1


def test_a_held_landing_keeps_every_caller_waiting_until_released(
    fake: FakeCoordinator, made: list[FlightGroup]
) -> None:
    a, b = made
    with fake.hold("k"):
        leader = Background(lambda: a.run_sync("k", lambda: "v"))
        # Decided at once, answered later: the leader has not even heard it leads.
        wait_until(lambda: fake.status() != [], "the fake decided")
        assert not leader.done.is_set()
    assert leader.wait().value == "v"
    started = threading.Event()
    leader2 = Leader(a, "j", "w", before=started.set)
    waiting = joiner(b, "j")
    with fake.hold("j"):
        leader2.release()
        assert started.wait(15)
        wait_until(lambda: fake.status() == [], "the landing was taken")
        assert not leader2.call.done.is_set()  # its `done` is held too
        assert not waiting.done.is_set()
    assert (leader2.result().value, waiting.wait().value) == ("w", "w")


def test_a_lost_joined_answer_still_ends_the_joiner_with_the_outcome(
    fake: FakeCoordinator, made: list[FlightGroup]
) -> None:
    a, b = made
    leader = Leader(a, "k", "v")
    fake.drop_next(Joined)
    waiting = Background(lambda: b.run_sync("k", never))
    wait_until(lambda: fake.status()[0]["joiners"] == 1, "b joined in the fake")
    leader.release()
    result = waiting.wait()
    assert (result.value, result.joined) == ("v", True)


def test_on_join_is_called_even_when_the_joined_answer_was_lost(
    fake: FakeCoordinator, made: list[FlightGroup]
) -> None:
    a, b = made
    leader = Leader(a, "k", "v")
    fake.drop_next(Joined)
    called: list[int] = []
    waiting = Background(lambda: b.run_sync("k", never, on_join=lambda: called.append(1)))
    wait_until(lambda: fake.status()[0]["joiners"] == 1, "b joined in the fake")
    leader.release()
    assert waiting.wait().joined
    assert called == [1]


def test_a_lost_landing_leaves_its_joiner_waiting_until_its_group_closes(
    fake: FakeCoordinator, made: list[FlightGroup]
) -> None:
    a, b = made
    leader = Leader(a, "k", "v")
    elsewhere = joiner(b, "k")
    fake.drop_next(Landed)
    leader.release()
    assert leader.result().value == "v"
    assert not elsewhere.done.wait(0.05)
    b.close()
    assert isinstance(raised(elsewhere), GroupClosedError)


def test_a_retry_takes_a_new_token_from_the_fake(fake: FakeCoordinator) -> None:
    g = fake.group(codec=JSON, retry=Retry(attempts=3, backoff=0.0, jitter=False))
    tokens: list[int] = []

    def work() -> int:
        tokens.append(current_lease().token)
        if len(tokens) < 3:
            raise ValueError("again")
        return len(tokens)

    try:
        result = g.run_sync("k", work)
    finally:
        g.close()
    assert result.value == 3 and result.token == tokens[-1]
    assert tokens == sorted(set(tokens))  # each attempt its own, growing token


def test_a_scope_that_answers_at_once_lets_an_async_leader_finish_in_its_call(
    fake: FakeCoordinator,
) -> None:
    g = fake.group(codec=JSON, retention=Retention(success=5))

    async def value() -> str:
        return "v"  # never suspends: with an eager start it all ends inside run()

    async def scenario() -> tuple[object, object]:
        first = await g.run("k", value)
        again = await asyncio.gather(*(g.run("k", value) for _ in range(3)))
        return first, again

    try:
        first, again = run(scenario())
    finally:
        g.close()
    assert first == ("v", False, 1)
    assert again == [("v", True, 1)] * 3


def test_two_coordinators_are_two_groups_and_one_coordinators_groups_are_one() -> None:
    one, two = FakeCoordinator(), FakeCoordinator()
    a, b = one.scope(), one.scope()
    assert a.identity == b.identity != two.scope().identity
    assert (a.kind, a.left_flights_hold_keys) == ("fake", False)
    assert isinstance(FakeCoordinator.scope_of(one.group(codec=JSON)), FakeScope)
    with pytest.raises(TypeError):
        one.group(codec=None)
    with pytest.raises(TypeError):
        FakeCoordinator.scope_of(FlightGroup())


def test_a_key_over_the_fakes_limit_is_refused_and_changes_nothing() -> None:
    fake = FakeCoordinator(max_key_length=4)
    g = fake.group(codec=JSON)
    try:
        with pytest.raises(ValueError):
            g.run_sync("too long", never)
        with pytest.raises(ValueError):
            g.forget("too long")
        assert g.run_sync("ok", lambda: 1).value == 1
    finally:
        g.close()
