"""Property test: random schedules of calls under every policy at once, against a model.

One thread drives a group with Retry (no pause), a deadline that never fires (async
works finish at once), Retention with a fake clock, Limits, and both call styles. The
schedule interleaves calls of a few keys (works that fail a scripted number of times),
forgets, fresh calls and clock advances. A work may call another key (nesting), which
is how two flights are in progress at once in one thread, so max_flights is reached.

Invariants checked after every step, beside the model's expected outcome of each call:
- a kept outcome is never older than its policy (served only within its TTL);
- a served kept outcome is the outcome of the latest settled flight of the key;
- every attempt got a fresh, growing token; Result.token is the last attempt's;
- the table is empty between calls; stats stay consistent.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightgroup import (
    FlightFailedError,
    FlightGroup,
    Limits,
    Retention,
    Retry,
    TooManyFlightsError,
    current_lease,
)

from ..support import flights_of, kept_entries, use_clock

KEYS = ("a", "b", "c")
SUCCESS_TTL = 5.0
ERROR_TTL = 2.0
ATTEMPTS = 3


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Kept:
    ok: bool
    value: Any
    token: int
    at: float


@dataclass
class Model:
    kept: dict[str, Kept] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    runs: int = 0
    calls: int = 0

    def live(self, key: str, now: float) -> Kept | None:
        entry = self.kept.get(key)
        if entry is None:
            return None
        ttl = SUCCESS_TTL if entry.ok else ERROR_TTL
        if now - entry.at >= ttl:
            del self.kept[key]
            return None
        return entry


class Failing(Exception):
    pass


calls = st.tuples(
    st.just("call"),
    st.sampled_from(KEYS),
    st.integers(min_value=0, max_value=4),  # failures before success (>= 3: the flight fails)
    st.booleans(),  # fresh
    st.booleans(),  # async
    st.sampled_from((None, *KEYS)),  # a nested call of this key from inside the work
)
steps = st.lists(
    st.one_of(
        calls,
        st.tuples(st.just("forget"), st.sampled_from(KEYS)),
        st.tuples(st.just("tick"), st.sampled_from((0.5, 1.0, 2.0, 4.5))),
    ),
    min_size=1,
    max_size=30,
)


# An async work's nested run_sync blocks its loop on purpose here (the model's calls are
# sync): the warning it gives is not what this test checks.
@pytest.mark.filterwarnings("ignore:.*running event loop:RuntimeWarning")
@settings(max_examples=150, deadline=None)
@given(steps)
def test_policies_against_a_model(schedule: list[tuple[Any, ...]]) -> None:
    g = FlightGroup(
        deadline=30.0,
        retry=Retry(attempts=ATTEMPTS, backoff=0.0, jitter=False, on=(Failing,)),
        retention=Retention(success=SUCCESS_TTL, error=ERROR_TTL, max_items=10),
        limits=Limits(max_flights=1, max_waiters=10),
    )
    clock = Clock()
    use_clock(g, clock)
    model = Model()
    serial = 0

    def make_work(key: str, failures: int, nested: str | None, is_async: bool) -> Any:
        nonlocal serial
        serial += 1
        tag = f"{key}#{serial}"
        attempts: list[int] = []

        def body() -> Any:
            token = current_lease().token
            assert not model.tokens or token > model.tokens[-1], "tokens grow per attempt"
            model.tokens.append(token)
            model.runs += 1
            attempts.append(token)
            if nested is not None:
                # A second flight while this one runs: max_flights=1 refuses a new key
                # (unless a kept outcome serves it), and the work's own key is refused
                # as a re-entrant call.
                live = None if nested == key else model.live(nested, clock.now)
                refused: BaseException | None = None
                try:
                    inner = g.run_sync(nested, lambda: "inner")
                except (TooManyFlightsError, RuntimeError, FlightFailedError) as exc:
                    refused = exc
                if isinstance(refused, TooManyFlightsError):
                    assert nested != key and live is None and refused.limit == 1
                elif isinstance(refused, FlightFailedError):
                    assert live is not None and not live.ok and refused.message == live.value
                elif refused is not None:
                    assert nested == key and "wait for itself" in str(refused)
                else:
                    assert live is not None and live.ok and inner.value == live.value
            if len(attempts) <= failures:
                raise Failing(f"{tag} attempt {len(attempts)}")
            return tag

        if is_async:

            async def async_work() -> Any:
                return body()

            return async_work, attempts
        return body, attempts

    for step in schedule:
        if step[0] == "tick":
            clock.now += step[1]
            continue
        if step[0] == "forget":
            g.forget(step[1])
            model.kept.pop(step[1], None)
            continue
        _, key, failures, fresh, is_async, nested = step
        work, attempts = make_work(key, failures, nested, is_async)
        runs_before = model.runs
        model.calls += 1
        try:
            if is_async:
                result = asyncio.run(g.run(key, work, fresh=fresh))
            else:
                result = g.run_sync(key, work, fresh=fresh)
            outcome: Any = result
        except (Failing, FlightFailedError) as exc:
            outcome = exc
        entry = None if fresh else model.live(key, clock.now)
        if entry is not None:
            # served from the kept outcome: nothing ran, joined=True, the same outcome
            assert model.runs == runs_before, "a kept outcome must not run the work"
            if entry.ok:
                assert not isinstance(outcome, BaseException)
                assert (outcome.value, outcome.joined, outcome.token) == (
                    entry.value,
                    True,
                    entry.token,
                )
            else:
                assert isinstance(outcome, FlightFailedError)
                assert outcome.message == entry.value
        else:
            ran = min(failures + 1, ATTEMPTS)
            assert len(attempts) == ran
            if failures < ATTEMPTS:
                assert not isinstance(outcome, BaseException)
                assert (outcome.value, outcome.joined) == (f"{key}#{serial}", False)
                assert outcome.token == attempts[-1]
                model.kept[key] = Kept(True, outcome.value, outcome.token, clock.now)
            else:
                assert isinstance(outcome, Failing)
                model.kept[key] = Kept(False, str(outcome), attempts[-1], clock.now)
        # nothing is left in flight, and every kept entry is younger than its TTL
        assert flights_of(g) == []
        for live in kept_entries(g):
            ttl = SUCCESS_TTL if live.ok else ERROR_TTL
            assert live.expires - clock.now <= ttl
        stats = g.stats()
        assert stats.in_flight == 0
        assert stats.flights == model.runs
        assert stats.kept == sum(1 for k in KEYS if model.live(k, clock.now) is not None)
