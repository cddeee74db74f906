"""The policies across a directory group: retention, fresh, forget, deadline, retry and
limits, between groups that each have their own connection to the coordinator (two
groups in one process meet only through the directory, like two processes do), and
what the scope does with a network directory or a closed group.

Interleavings are forced with events; nothing here waits on a sleep to be right.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest

import flightgroup.directory.epochs as epochs
import flightgroup.directory.fs as fs_module
from flightgroup import (
    JSON,
    FlightFailedError,
    FlightGroup,
    FlightTimeoutError,
    GroupClosedError,
    Limits,
    NetworkDirectoryError,
    Retention,
    Retry,
    TooManyWaitersError,
    current_lease,
)

from ..ingroup import arbiter
from ..support import run, scope_of, wait_until


def _groups(directory: str, n: int = 2, **kwargs: object) -> list[FlightGroup]:
    return [FlightGroup(directory=directory, codec=JSON, **kwargs) for _ in range(n)]  # type: ignore[arg-type]


def _close(*groups: FlightGroup) -> None:
    for group in groups:
        group.close()


def test_a_kept_outcome_is_served_to_another_group_without_a_run(directory: str) -> None:
    a, b = _groups(directory, retention=Retention(success=60.0))
    try:
        runs: list[str] = []
        first = a.run_sync("k", lambda: runs.append("a") or {"n": 1})
        assert first.joined is False and first.value == {"n": 1}
        joins: list[int] = []
        kept = b.run_sync(
            "k", lambda: runs.append("b") or {"n": 2}, on_join=lambda: joins.append(1)
        )
        assert kept.value == {"n": 1} and kept.joined is True
        assert kept.token == first.token  # the token of the flight that produced it
        assert joins == []  # a call served from a kept outcome is not a joiner
        assert runs == ["a"]
        # forget() in one group acts on the whole directory
        b.forget("k")
        again = a.run_sync("k", lambda: runs.append("a2") or {"n": 3})
        assert again.value == {"n": 3} and again.joined is False
        assert again.token > first.token
        assert runs == ["a", "a2"]
    finally:
        _close(a, b)


def test_a_kept_failure_is_a_flight_failed_error_elsewhere(directory: str) -> None:
    a, b = _groups(directory, retention=Retention(success=None, error=60.0))
    try:
        def boom() -> None:
            raise KeyError("missing")

        with pytest.raises(KeyError) as raised:
            a.run_sync("k", boom)
        with pytest.raises(FlightFailedError) as caught:
            b.run_sync("k", lambda: "never")
        # b is another group of the leader's process: the cause is the work's error
        assert caught.value.error_type == "KeyError"
        assert caught.value.__cause__ is raised.value
    finally:
        _close(a, b)


def test_fresh_callers_elsewhere_share_the_next_flight(directory: str) -> None:
    a, b, c = _groups(directory, 3)
    try:
        started, release = threading.Event(), threading.Event()
        runs: list[str] = []

        def first() -> str:
            runs.append("first")
            started.set()
            release.wait(10)
            return "old"

        def second() -> str:
            runs.append("second")
            return "new"

        results: dict[str, object] = {}
        leader = threading.Thread(target=lambda: results.update(a=a.run_sync("k", first)))
        leader.start()
        assert started.wait(10)
        fresh = [
            threading.Thread(
                target=lambda g=g, n=n: results.update({n: g.run_sync("k", second, fresh=True)})
            )
            for g, n in ((b, "b"), (c, "c"))
        ]
        for thread in fresh:
            thread.start()
        # Both fresh calls reached the coordinator and wait for the running flight's end.
        wait_until(lambda: _fresh_waiting(a, "k") == 2, "two fresh calls waiting")
        release.set()
        for thread in (leader, *fresh):
            thread.join(10)
        assert results["a"].value == "old"  # type: ignore[attr-defined]
        values = {results[n].value for n in "bc"}  # type: ignore[attr-defined]
        assert values == {"new"}
        assert sorted(results[n].joined for n in "bc") == [False, True]  # type: ignore[attr-defined]
        assert runs == ["first", "second"]
    finally:
        _close(a, b, c)


def _fresh_waiting(group: FlightGroup, key: str) -> int:
    """How many fresh runs the coordinator holds for ``key``'s flight (test-only peek at
    the coordinator, which runs in this process)."""
    for candidate in (group,):
        arbiter = scope_of(candidate)
        assert arbiter is not None
        coordinator = arbiter._state.coordinator
        if coordinator is not None:
            flight = coordinator._term.flights.get(key)
            return 0 if flight is None else len(flight.fresh)
    return -1


def test_a_deadline_reaches_joiners_in_other_groups(directory: str) -> None:
    a, b = _groups(directory, deadline=0.2)
    try:
        async def main() -> None:
            entered = asyncio.Event()

            async def slow() -> str:
                entered.set()
                await asyncio.Event().wait()  # never ends: the deadline stops it
                return "never"

            leader = asyncio.create_task(a.run("k", slow))
            await entered.wait()
            joined = asyncio.Event()
            joiner = asyncio.create_task(b.run("k", slow, on_join=joined.set))
            await joined.wait()
            with pytest.raises(FlightTimeoutError):
                await leader
            with pytest.raises(FlightTimeoutError) as caught:
                await joiner
            assert caught.value.deadline == 0.2

        run(main())
    finally:
        _close(a, b)


def test_each_attempt_gets_a_new_token_from_the_coordinator(directory: str) -> None:
    a, b = _groups(directory, retry=Retry(attempts=3, backoff=0.001, jitter=False))
    try:
        tokens: list[int] = []
        joined = threading.Event()
        go = threading.Event()

        def flaky() -> str:
            tokens.append(current_lease().token)
            if len(tokens) == 1:
                go.wait(10)  # the joiner attaches during the first attempt
            if len(tokens) < 3:
                raise ConnectionError("try again")
            return "third time"

        results: list[object] = []
        leader = threading.Thread(target=lambda: results.append(a.run_sync("k", flaky)))
        leader.start()
        wait_until(lambda: len(tokens) == 1, "the first attempt")
        joiner = threading.Thread(
            target=lambda: results.append(b.run_sync("k", flaky, on_join=joined.set))
        )
        joiner.start()
        assert joined.wait(10)
        go.set()
        leader.join(10)
        joiner.join(10)
        assert sorted(r.joined for r in results) == [False, True]  # type: ignore[attr-defined]
        assert {r.value for r in results} == {"third time"}  # type: ignore[attr-defined]
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        assert all(token >> 32 == tokens[0] >> 32 for token in tokens)  # one term
        # The result carries the token of the attempt that produced the outcome.
        assert {r.token for r in results} == {tokens[-1]}  # type: ignore[attr-defined]
    finally:
        _close(a, b)


def test_max_waiters_counts_this_process_only(directory: str) -> None:
    """Each process counts the joiners waiting in it, its first caller among them."""
    a, b = _groups(directory, limits=Limits(max_waiters=2))
    try:
        async def main() -> None:
            entered, release = asyncio.Event(), asyncio.Event()

            async def work() -> int:
                entered.set()
                await release.wait()
                return 7

            leader = asyncio.create_task(a.run("k", work))
            await entered.wait()
            joined_b = asyncio.Event()
            # b's first caller asks the directory (one request for b) and joins a's
            # flight, its second joins b's local flight: two joiners wait in b, its
            # limit.
            b1 = asyncio.create_task(b.run("k", work, on_join=joined_b.set))
            await joined_b.wait()
            joined_b2 = asyncio.Event()
            b2 = asyncio.create_task(b.run("k", work, on_join=joined_b2.set))
            await joined_b2.wait()
            with pytest.raises(TooManyWaitersError):
                await b.run("k", work)
            # a's own joiners are counted in a, not in b (its leader is none)
            joined_a, joined_a3 = asyncio.Event(), asyncio.Event()
            a2 = asyncio.create_task(a.run("k", work, on_join=joined_a.set))
            a3 = asyncio.create_task(a.run("k", work, on_join=joined_a3.set))
            await joined_a.wait()
            await joined_a3.wait()
            release.set()
            results = await asyncio.gather(leader, b1, b2, a2, a3)
            assert [r.value for r in results] == [7] * 5

        run(main())
    finally:
        _close(a, b)


def test_a_network_directory_makes_every_call_raise(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No NFS server here: the file system type is what /proc/self/mountinfo would say.
    monkeypatch.setattr(fs_module, "file_system_of", lambda path, mountinfo=None: "nfs4")
    monkeypatch.setattr(fs_module, "_local_cache", {})
    group = FlightGroup(directory=directory, codec=JSON)
    try:
        for _ in range(2):
            with pytest.raises(NetworkDirectoryError) as caught:
                group.run_sync("k", lambda: 1)
            assert caught.value.file_system.lower().startswith("nfs")
            assert caught.value.directory == os.path.abspath(directory)

        async def call() -> None:
            with pytest.raises(NetworkDirectoryError):
                await group.run("k", asyncio.sleep, on_join=None)

        run(call())
        assert not os.path.exists(directory)  # nothing was created there
    finally:
        group.close()


def test_a_closed_group_rejects_calls_and_the_directory_goes_on(directory: str) -> None:
    a, b = _groups(directory)
    a.run_sync("warm", lambda: 1)  # a coordinates
    a.close()
    with pytest.raises(GroupClosedError):
        a.run_sync("k", lambda: 1)
    try:
        assert b.run_sync("k", lambda: 2).value == 2  # b took over the election
        epoch = epochs.read_epoch(directory)
        assert epoch is not None and epoch >= 2
    finally:
        b.close()


def test_status_lists_the_flights_in_progress(directory: str) -> None:
    a, b = _groups(directory)
    try:
        started, release = threading.Event(), threading.Event()

        def work() -> str:
            started.set()
            release.wait(10)
            return "done"

        results: list[object] = []
        leader = threading.Thread(target=lambda: results.append(a.run_sync("k", work)))
        leader.start()
        assert started.wait(10)
        joined = threading.Event()
        joiner = threading.Thread(
            target=lambda: results.append(b.run_sync("k", work, on_join=joined.set))
        )
        joiner.start()
        assert joined.wait(10)
        assert scope_of(b) is not None
        flights = [f for f in scope_of(b).status() if f["key"] == "k"]
        assert len(flights) == 1
        flight = flights[0]
        assert set(flight) == {"key", "token", "leader_pid", "joiners", "age_s"}
        assert flight["leader_pid"] == os.getpid() and flight["joiners"] == 1
        assert flight["token"] >> 32 == epochs.read_epoch(directory)
        release.set()
        leader.join(10)
        joiner.join(10)
        arbiter = scope_of(b)
        # (a's landing and b's request travel on two connections: no order between them)
        wait_until(lambda: not [f for f in arbiter.status() if f["key"] == "k"], "no flight")
    finally:
        _close(a, b)


def test_a_kept_failure_landed_while_the_coordinator_was_stopped_keeps_its_cause(
    h: Any,
) -> None:
    """The leader returns once its landing is sent; the coordinator keeps the failure
    from when it reads the landing. Stopped past the keep time meanwhile, it then keeps
    the failure for the whole keep time, and a call of the leader's group is served it
    with its ``__cause__``: the group remembers the error as long as the coordinator
    keeps it, not a keep time counted from the landing."""
    coordinator = h.spawn_warm("a")
    g = FlightGroup(
        directory=h.dir, codec=JSON, retention=Retention(success=None, error=1.0)
    )
    try:
        g.run_sync("warm", lambda: 0)  # connected to a's coordinator
        original = KeyError("missing")
        started, release = threading.Event(), threading.Event()

        def boom() -> None:
            started.set()
            release.wait(20)
            raise original

        raised: list[BaseException] = []

        def lead() -> None:
            try:
                g.run_sync("k", boom)
            except KeyError as exc:
                raised.append(exc)

        leader = threading.Thread(target=lead)
        leader.start()
        assert started.wait(20)  # it leads: the coordinator answered
        coordinator.stop()  # returns once it is stopped: it cannot read the landing
        try:
            release.set()
            # Landed (sent), not yet read by the coordinator: the leader waits for it.
            wait_until(
                lambda: any(lead.landing for lead in arbiter(g)._state.leads.values()),
                "the landing was sent",
            )
            time.sleep(1.2)  # the keep time passes before the coordinator reads it
            assert raised == []
        finally:
            coordinator.cont()
        leader.join(20)
        assert raised == [original]
        with pytest.raises(FlightFailedError) as kept:
            g.run_sync("k", lambda: "never")  # after the landing on one connection
        assert kept.value.error_type == "KeyError"  # served the kept failure
        assert kept.value.__cause__ is original
    finally:
        g.close()
