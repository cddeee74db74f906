"""on_join in the directory scope: a leading caller whose flight joins one led elsewhere
calls on_join once, whichever of the scope's answers and the landing comes first, and
withdraws alone when on_join raises.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import flightgroup.scope.bridge as bridge_module
from flightgroup.directory.client import DirectoryArbiter
from flightgroup.engine.flight import JOINED
from flightgroup.scope.events import Joined, Landed

from ..ingroup import Background, remote_leader
from ..ingroup import close as _close
from ..ingroup import coordinating as _coordinating
from ..ingroup import group as _group
from ..support import scope_of, table_of, wait_until


def test_sync_leading_caller_with_timeout_calls_on_join_when_joined_and_landed_race(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync leading caller with a timeout calls on_join when JOINED and LANDED race."""
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = remote_leader(directory)
    real_wake = bridge_module.wake
    settled = threading.Event()
    real_submit = DirectoryArbiter.submit

    def submit(self: DirectoryArbiter, key: str, **options: Any) -> Any:
        if self is scope_of(b):  # the caller waits as the leader before the answer comes
            wait_until(
                lambda: table_of(b).flights["k"].leader_waiter is not None, "the caller waits"
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
        wait_until(lambda: "k" not in table_of(b).flights, "b's flight settled from the landing")
        settled.set()
        result = call.wait()
        assert result.value == "value" and result.joined is True
        assert joins == [1]
        assert leader.wait().value == "value"
    finally:
        release.set()
        settled.set()
        _close(a, b, c)


def test_async_leading_caller_calls_on_join_when_the_landing_is_already_in(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async leading caller calls on_join when the landing is already in its inbox."""
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = remote_leader(directory)
    real_submit = DirectoryArbiter.submit

    def submit(self: DirectoryArbiter, key: str, **options: Any) -> Any:
        call = real_submit(self, key, **options)
        if self is scope_of(b):
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
        assert joins == [1]
        assert leader.wait().value == "value"
    finally:
        release.set()
        _close(a, b, c)


def test_async_leading_caller_calls_on_join_once_when_it_joins_elsewhere(directory: str) -> None:
    """An async leading caller whose flight joins one led elsewhere calls on_join once."""
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = remote_leader(directory)
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
    """A sync leading caller whose on_join raises withdraws at once."""
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = remote_leader(directory)
    try:
        def on_join() -> None:
            raise LookupError("not now")

        call = Background(lambda: b.run_sync("k", lambda: "never", on_join=on_join))
        withdrew = call.done.wait(3)
        release.set()
        call.done.wait(10)
        assert withdrew, "the call waited for the whole flight"
        assert isinstance(call.error, LookupError)
        assert leader.wait().value == "value"
    finally:
        release.set()
        _close(a, b, c)
