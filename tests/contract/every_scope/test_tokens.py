"""docs/api.md, Calls, Inside the work and Policies: ``Result.token`` is the fencing token of
the attempt that produced the outcome; tokens grow within a group (every process of a
wide one); each attempt has its own; a retry belongs to the flight, whose joiners, here
and elsewhere, stay attached through it."""

from __future__ import annotations

import threading

import pytest

from flightgroup import FlightGroup, Retry, current_lease

from ...ingroup import Background
from .conftest import Scope, never

NO_WAIT = Retry(attempts=3, backoff=0.0, jitter=False)


def test_tokens_grow_within_a_group(group: FlightGroup) -> None:
    tokens = [group.run_sync(key, lambda: 1).token for key in ("a", "b", "a")]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_tokens_grow_across_the_processes_of_a_wide_group(
    pair: tuple[FlightGroup, ...],
) -> None:
    a, b = pair
    first = a.run_sync("k", lambda: 1).token
    second = b.run_sync("k", lambda: 2).token
    assert second > first


def test_the_lease_names_the_key_and_the_results_token(group: FlightGroup) -> None:
    seen = []

    def work() -> int:
        lease = current_lease()
        seen.append((lease.key, lease.token, lease.lost))
        return 1

    result = group.run_sync("k", work)
    assert seen == [("k", result.token, False)]
    with pytest.raises(LookupError):
        current_lease()


def test_each_attempt_has_its_own_token_and_the_result_has_the_last(scope: Scope) -> None:
    g = scope.group(retry=NO_WAIT)
    tokens: list[int] = []

    def work() -> int:
        tokens.append(current_lease().token)
        if len(tokens) < 3:
            raise ValueError("again")
        return len(tokens)

    result = g.run_sync("k", work)
    assert (result.value, result.token) == (3, tokens[-1])
    assert tokens == sorted(set(tokens))


def test_a_joiner_elsewhere_stays_attached_through_the_leaders_retries(wide: Scope) -> None:
    a, b = wide.group(retry=NO_WAIT), wide.group()  # the leader's policy is the flight's
    first_started, go_on = threading.Event(), threading.Event()
    attempts: list[int] = []

    def work() -> str:
        attempts.append(current_lease().token)
        if len(attempts) == 1:
            first_started.set()
            assert go_on.wait(30)
        if len(attempts) < 3:
            raise ValueError("again")
        return "third"

    leader = Background(lambda: a.run_sync("k", work))
    assert first_started.wait(15)
    heard: list[str] = []
    joined_now = threading.Event()

    def on_join() -> None:
        heard.append(threading.current_thread().name)
        joined_now.set()

    elsewhere = Background(lambda: b.run_sync("k", never, on_join=on_join))
    assert joined_now.wait(15)
    go_on.set()
    led, joined = leader.wait(), elsewhere.wait()
    assert (led.value, joined.value, joined.joined) == ("third", "third", True)
    assert len(heard) == 1  # a new token per retry is no new join
    assert joined.token == led.token == attempts[-1]
