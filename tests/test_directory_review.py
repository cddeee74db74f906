"""An adversarial review of the directory scope: races between callers, the group's
background loop and key-lock threads; failover, close, fresh, forget, retries and
deadlines across groups. Groups in one process meet only through the directory, like
processes do. Interleavings are forced with events and hooks; every wait is bounded.

A test marked xfail(strict=True) shows a bug that is in the code today; the others
document cases that were checked and hold.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import flightgroup.scope.bridge as bridge_module
from flightgroup import (
    FlightGroup,
    FlightInterruptedError,
    FlightTimeoutError,
    GroupClosedError,
    Retention,
    Retry,
    current_lease,
)
from flightgroup.directory.client import DirectoryArbiter
from flightgroup.engine.flight import JOINED
from flightgroup.scope.events import Joined, Landed

from .ingroup import Background
from .ingroup import close as _close
from .ingroup import closed_leader_holds as _closed_leader_holds
from .ingroup import coordinating as _coordinating
from .ingroup import group as _group
from .ingroup import key_lock_free as _key_lock_free
from .ingroup import key_watchers as _key_watchers
from .ingroup import landed_leader_holds as _landed_leader_holds
from .ingroup import lock_waiters as _lock_waiters
from .support import wait_until


def _live_coordinator(*groups: FlightGroup) -> Any:
    for group in groups:
        arbiter = group._scope
        assert arbiter is not None
        coordinator = arbiter._coordinator
        if coordinator is not None and not coordinator.closed:
            return coordinator
    return None


# -----------------------------------------------------------------------------
# Retries and failover
# -----------------------------------------------------------------------------


def test_joiner_of_a_retried_flight_survives_a_failover(directory: str) -> None:
    c = _coordinating(directory)
    a = _group(directory, retry=Retry(attempts=2, backoff=0.001, jitter=False))
    b = _group(directory)
    try:
        first_running, fail_first = threading.Event(), threading.Event()
        second_running, release = threading.Event(), threading.Event()
        tokens: list[int] = []

        def work() -> str:
            tokens.append(current_lease().token)
            if len(tokens) == 1:
                first_running.set()
                fail_first.wait(10)
                raise ValueError("first attempt fails")
            second_running.set()
            release.wait(10)
            return "value"

        leader = Background(lambda: a.run_sync("k", work))
        assert first_running.wait(10)
        joined = threading.Event()
        joiner = Background(lambda: b.run_sync("k", lambda: "never", on_join=joined.set))
        assert joined.wait(10)  # b joined attempt 1 (its token)
        fail_first.set()
        assert second_running.wait(10)
        assert tokens[1] > tokens[0]
        c.close()  # the coordinator goes; a or b serves now; a reasserts, b rejoins

        def rejoined() -> bool:
            if joiner.done.is_set():
                return True
            coordinator = _live_coordinator(a, b)
            if coordinator is None:
                return False
            flight = coordinator._flights.get("k")
            return flight is not None and len(flight.joiners) == 1

        wait_until(rejoined, "b rejoined (or ended)")
        release.set()
        assert leader.wait().value == "value"
        result = joiner.wait()  # today: FlightInterruptedError
        assert result.value == "value" and result.joined is True
    finally:
        release.set()
        fail_first.set()
        _close(a, b, c)


def test_joiner_of_a_flight_without_retry_survives_a_failover(directory: str) -> None:
    c = _coordinating(directory)
    a, b = _group(directory), _group(directory)
    try:
        running, release = threading.Event(), threading.Event()

        def work() -> str:
            running.set()
            release.wait(10)
            return "value"

        leader = Background(lambda: a.run_sync("k", work))
        assert running.wait(10)
        joined = threading.Event()
        joiner = Background(lambda: b.run_sync("k", lambda: "never", on_join=joined.set))
        assert joined.wait(10)
        c.close()

        def rejoined() -> bool:
            coordinator = _live_coordinator(a, b)
            if coordinator is None:
                return False
            flight = coordinator._flights.get("k")
            return flight is not None and len(flight.joiners) == 1

        wait_until(rejoined, "b rejoined")
        release.set()
        assert leader.wait().value == "value"
        result = joiner.wait()
        assert result.value == "value" and result.joined is True
    finally:
        release.set()
        _close(a, b, c)


# -----------------------------------------------------------------------------
# fresh, forget, retention across groups
# -----------------------------------------------------------------------------


def test_fresh_caller_elsewhere_never_gets_the_kept_outcome_of_the_older_flight(
    directory: str,
) -> None:
    a, b = _group(directory, retention=Retention(success=60.0)), _group(directory)
    try:
        running, release = threading.Event(), threading.Event()

        def old() -> str:
            running.set()
            release.wait(10)
            return "old"

        leader = Background(lambda: a.run_sync("k", old))
        assert running.wait(10)
        fresh = Background(lambda: b.run_sync("k", lambda: "new", fresh=True))

        def waiting_fresh() -> bool:
            coordinator = _live_coordinator(a, b)
            flight = None if coordinator is None else coordinator._flights.get("k")
            return flight is not None and len(flight.fresh) == 1

        wait_until(waiting_fresh, "the fresh call waits for the flight's end")
        release.set()
        assert leader.wait().value == "old"
        result = fresh.wait()
        assert result.value == "new"  # today: "old", kept=True
        assert result.joined is False
    finally:
        release.set()
        _close(a, b)


def test_forget_from_a_group_that_never_called_reaches_the_coordinator(directory: str) -> None:
    a = _coordinating(directory, retention=Retention(success=60.0))
    b = _group(directory, retention=Retention(success=60.0))
    try:
        assert a.run_sync("k", lambda: "v1").value == "v1"
        b.forget("k")  # a later call anywhere leads a new flight (API.md)
        again = b.run_sync("k", lambda: "v2")
        assert again.value == "v2" and again.joined is False  # today: "v1", joined
    finally:
        _close(a, b)


def test_forget_from_a_connected_group_drops_the_kept_outcome_everywhere(directory: str) -> None:
    a = _coordinating(directory, retention=Retention(success=60.0))
    b = _group(directory, retention=Retention(success=60.0))
    try:
        assert b.run_sync("other", lambda: 0).value == 0  # b is connected
        assert a.run_sync("k", lambda: "v1").value == "v1"
        assert b.run_sync("k", lambda: "x").value == "v1"  # kept
        b.forget("k")
        again = a.run_sync("k", lambda: "v2")
        assert again.value == "v2" and again.joined is False
    finally:
        _close(a, b)


# -----------------------------------------------------------------------------
# close() and key locks
# -----------------------------------------------------------------------------


def test_a_closed_groups_running_work_keeps_the_key_and_the_next_call_waits(
    directory: str,
) -> None:
    c = _coordinating(directory)
    b = _group(directory)
    _a, release, runs = _closed_leader_holds(directory)
    try:
        def work_b() -> str:
            runs.append("b")
            return "b"

        call = Background(lambda: b.run_sync("k", work_b))
        assert not call.done.wait(0.3)
        assert runs == ["a"]  # b waits for the key lock: never beside a's work
        release.set()
        result = call.wait()
        assert result.value == "b" and result.joined is False
        assert runs == ["a", "b"]
    finally:
        release.set()
        _close(b, c)


def test_calls_of_a_key_a_closed_groups_work_holds_wait_on_the_one_watcher(
    directory: str,
) -> None:
    """Each group that called ``k`` while a closed group's work held its lock, then
    closed, once left a key-lock thread (and a descriptor) blocked in flock until that
    work ended: the interrupted landing told the coordinator the lock would be freed at
    once, so each call led and waited in a thread of its own. They now wait at the
    coordinator, on the key's one watcher; the first call after the work ends leads."""
    c = _coordinating(directory)
    _a, release, runs = _closed_leader_holds(directory)
    try:
        async def work() -> str:
            runs.append("late")
            return "late"

        for _ in range(5):
            g = _group(directory)

            async def main(g: FlightGroup = g) -> None:
                async with g:
                    with pytest.raises(TimeoutError):  # a's work holds k all along
                        await g.run("k", work, timeout=0.2)

            asyncio.run(main())
        assert _lock_waiters(directory) == 0  # no lead waits in a key-lock thread
        assert len(_key_watchers(directory)) == 1  # the coordinator's, for k
        release.set()
        b = _group(directory)
        try:
            result = b.run_sync("k", lambda: "b")
            assert (result.value, result.joined) == ("b", False)
        finally:
            b.close()
        assert runs == ["a"]
    finally:
        release.set()
        _close(c)


def test_close_wakes_a_sync_leader_waiting_for_the_key_lock(directory: str) -> None:
    c = _coordinating(directory)
    b = _group(directory)
    a, release, runs = _landed_leader_holds(directory)
    try:
        def work_b() -> str:
            runs.append("b")
            return "b"

        call = Background(lambda: b.run_sync("k", work_b))
        arbiter = b._scope
        assert arbiter is not None
        wait_until(lambda: len(arbiter._leads) == 1, "b leads k and waits for its lock")
        closing = Background(b.close)
        closing.wait()
        ended = call.done.wait(3)  # today: still blocked in the bridge's drive_sync inbox
        release.set()
        call.done.wait(10)
        assert ended, "the caller hung after close()"
        assert isinstance(call.error, GroupClosedError)
        assert runs == ["a", "a2"]  # no work starts in a closed group
    finally:
        release.set()
        _close(b, a, c)


def test_a_lead_waiting_on_its_key_lock_at_close_never_leaks_the_lock(directory: str) -> None:
    c = _coordinating(directory)
    b = _group(directory)
    a, release, runs = _landed_leader_holds(directory)
    arbiter = b._scope
    assert arbiter is not None
    try:
        async def work_b() -> str:
            runs.append("b")
            return "b"

        async def main() -> None:
            async with b:  # the usual shape: the group closes with the program's loop
                with pytest.raises(TimeoutError):
                    await b.run("k", work_b, timeout=0.5)
                assert len(arbiter._leads) == 1  # b leads k and waits for its lock

        asyncio.run(main())  # aclose(), then the loop's end cancels the driver task
        assert _lock_waiters(directory) == 1  # b's lead still waits in flock
        release.set()  # a's work ends: a frees the key lock, b's waiting flock takes it
        wait_until(lambda: _lock_waiters(directory) == 0, "b's key-lock thread got the lock")
        assert runs == ["a", "a2"]
        assert _key_lock_free(directory, "k"), "nobody runs k, yet its key lock stays held"
    finally:
        release.set()
        for lead in list(arbiter._leads.values()):
            lead.release()  # the leaked fd
        _close(a, c)


def test_a_sync_work_past_its_deadline_keeps_the_key_lock_until_it_ends(directory: str) -> None:
    c = _coordinating(directory)
    a = _group(directory, deadline=0.2)
    b = _group(directory)
    try:
        running, release = threading.Event(), threading.Event()
        active: list[str] = []
        overlaps: list[list[str]] = []

        def slow() -> str:
            active.append("a")
            running.set()
            release.wait(20)
            active.remove("a")
            return "a"

        def other() -> str:
            overlaps.append(list(active))
            return "b"

        with pytest.raises(FlightTimeoutError):
            a.run_sync("k", slow)
        assert active == ["a"]  # the sync work could not be stopped: it runs on
        lock_held = not _key_lock_free(directory, "k")
        call = Background(lambda: b.run_sync("k", other))
        started_beside = call.done.wait(1.0)
        release.set()
        call.wait()
        assert lock_held, "the key lock was freed while the work still runs"
        assert not started_beside and overlaps == [[]], "k ran twice at once"
    finally:
        release.set()
        _close(a, b, c)


# -----------------------------------------------------------------------------
# on_join of a leading caller whose flight joins a flight led elsewhere
# -----------------------------------------------------------------------------


def _remote_leader(
    directory: str,
) -> tuple[FlightGroup, threading.Event, threading.Event, Background]:
    a = _group(directory)
    running, release = threading.Event(), threading.Event()

    def work() -> str:
        running.set()
        release.wait(20)
        return "value"

    leader = Background(lambda: a.run_sync("k", work, timeout=60))
    assert running.wait(10)
    return a, running, release, leader


def test_sync_leading_caller_with_timeout_calls_on_join_when_joined_and_landed_race(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = _remote_leader(directory)
    real_wake = bridge_module.wake
    settled = threading.Event()
    real_submit = DirectoryArbiter.submit

    def submit(self: DirectoryArbiter, key: str, **options: Any) -> Any:
        if self is b._scope:  # the caller waits as the leader before the answer comes
            wait_until(
                lambda: b._table.flights["k"].leader_waiter is not None, "the caller waits"
            )
        return real_submit(self, key, **options)

    def wake(waiters: Any, signal: Any) -> None:
        if signal is JOINED:
            # The woken caller thread is scheduled late: the landing settles first.
            waiters = list(waiters)
            release.set()
            threading.Thread(
                target=lambda: (settled.wait(10), real_wake(waiters, signal)), daemon=True
            ).start()
            return
        real_wake(waiters, signal)

    monkeypatch.setattr(DirectoryArbiter, "submit", submit)
    monkeypatch.setattr(bridge_module, "wake", wake)
    try:
        joins: list[int] = []
        call = Background(
            lambda: b.run_sync("k", lambda: "never", on_join=lambda: joins.append(1), timeout=15)
        )
        wait_until(lambda: "k" not in b._table.flights, "b's flight settled from the landing")
        settled.set()
        result = call.wait()
        assert result.value == "value" and result.joined is True
        assert joins == [1]  # today: []
        assert leader.wait().value == "value"
    finally:
        release.set()
        settled.set()
        _close(a, b, c)


def test_async_leading_caller_calls_on_join_when_the_landing_is_already_in(
    directory: str, monkeypatch: pytest.MonkeyPatch, task_start: str
) -> None:
    """Each way the leader's task starts (eagerly on 3.12+, through the loop)."""
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = _remote_leader(directory)
    real_submit = DirectoryArbiter.submit

    def submit(self: DirectoryArbiter, key: str, **options: Any) -> Any:
        call = real_submit(self, key, **options)
        if self is b._scope:
            # The caller's thread is slow to go on (its key file's create, say): the
            # joined answer and then the landing are in its inbox before its first await.
            wait_until(lambda: len(call.inbox.pending()) >= 1, "joined")
            release.set()
            wait_until(lambda: len(call.inbox.pending()) >= 2, "landed")
            assert [type(e) for e in call.inbox.pending()] == [Joined, Landed]
        return call

    monkeypatch.setattr(DirectoryArbiter, "submit", submit)
    try:
        joins: list[int] = []

        async def main() -> Any:
            async def never() -> str:
                return "never"

            return await b.run("k", never, on_join=lambda: joins.append(1))

        result = asyncio.run(main())
        assert result.value == "value" and result.joined is True
        assert joins == [1]  # today: []
        assert leader.wait().value == "value"
    finally:
        release.set()
        _close(a, b, c)


def test_async_leading_caller_calls_on_join_once_when_it_joins_elsewhere(directory: str) -> None:
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = _remote_leader(directory)
    try:
        joins: list[int] = []

        async def main() -> Any:
            async def never() -> str:
                return "never"

            joined = asyncio.Event()

            def on_join() -> None:
                joins.append(1)
                joined.set()

            task = asyncio.create_task(b.run("k", never, on_join=on_join))
            await asyncio.wait_for(joined.wait(), 10)
            release.set()
            return await task

        result = asyncio.run(main())
        assert result.value == "value" and result.joined is True
        assert joins == [1]
        assert leader.wait().value == "value"
    finally:
        release.set()
        _close(a, b, c)


def test_sync_leading_caller_whose_on_join_raises_withdraws_at_once(directory: str) -> None:
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = _remote_leader(directory)
    try:
        def on_join() -> None:
            raise LookupError("not now")

        call = Background(lambda: b.run_sync("k", lambda: "never", on_join=on_join))
        withdrew = call.done.wait(3)  # today: waits until a's work ends
        release.set()
        call.done.wait(10)
        assert withdrew, "the call waited for the whole flight"
        assert isinstance(call.error, LookupError)
        assert leader.wait().value == "value"
    finally:
        release.set()
        _close(a, b, c)


def test_joiner_elsewhere_is_interrupted_when_the_leaders_group_closes(directory: str) -> None:
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = _remote_leader(directory)
    try:
        joined = threading.Event()
        call = Background(lambda: b.run_sync("k", lambda: "never", on_join=joined.set))
        assert joined.wait(10)
        Background(a.close).wait()
        with pytest.raises(FlightInterruptedError):
            call.wait()
        with pytest.raises(GroupClosedError):
            leader.wait()
    finally:
        release.set()
        _close(a, b, c)


def test_a_flight_forgotten_while_it_runs_is_not_kept(directory: str) -> None:
    c = _coordinating(directory)
    a = _group(directory, retention=Retention(success=60.0))
    b = _group(directory, retention=Retention(success=60.0))
    try:
        assert b.run_sync("other", lambda: 0).value == 0  # b is connected
        running, release = threading.Event(), threading.Event()

        def stale() -> str:
            running.set()
            release.wait(10)
            return "stale"

        leader = Background(lambda: a.run_sync("k", stale))
        assert running.wait(10)
        b.forget("k")  # e.g. after a write: the running flight read the old data
        release.set()
        assert leader.wait().value == "stale"
        again = b.run_sync("k", lambda: "fresh")
        assert again.value == "fresh" and again.joined is False  # today: "stale", kept
    finally:
        release.set()
        _close(a, b, c)


def test_a_call_after_forget_waits_for_the_detached_flight_then_leads(directory: str) -> None:
    c = _coordinating(directory)
    a, b = _group(directory), _group(directory)
    try:
        assert b.run_sync("other", lambda: 0).value == 0
        running, release = threading.Event(), threading.Event()
        active: list[str] = []
        overlaps: list[list[str]] = []

        def old() -> str:
            active.append("a")
            running.set()
            release.wait(10)
            active.remove("a")
            return "old"

        def new() -> str:
            overlaps.append(list(active))
            return "new"

        leader = Background(lambda: a.run_sync("k", old))
        assert running.wait(10)
        b.forget("k")
        call = Background(lambda: b.run_sync("k", new))
        assert not call.done.wait(0.3)  # waits on a's key lock: never beside it
        release.set()
        assert leader.wait().value == "old"
        result = call.wait()
        assert result.value == "new" and result.joined is False
        assert overlaps == [[]]
    finally:
        release.set()
        _close(a, b, c)
