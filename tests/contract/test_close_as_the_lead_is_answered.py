"""A wide group closed between the scope's LEAD answer and the work's start: close()
has returned, so the work must not start after it (docs/api.md: closing makes every waiting
call raise GroupClosedError); the lead goes back to the scope, and another group of
the key leads. The window is held open by a patched ``Bridge._lead``."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flightgroup import FlightGroup, GroupClosedError
from flightgroup.scope.bridge import Bridge

from ..ingroup import Background
from ..support import bridge_of

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_lead_answered_as_the_group_closes_starts_no_work(
    pair: tuple[FlightGroup, FlightGroup], how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    g, other = pair
    ran: list[str] = []
    reached, closed = threading.Event(), threading.Event()
    original = Bridge._lead

    def held(of: Bridge, *args: Any) -> Any:
        if of is bridge_of(g):
            reached.set()
            assert closed.wait(20)
        return original(of, *args)

    monkeypatch.setattr(Bridge, "_lead", held)
    if how == "sync":
        caller = Background(lambda: g.run_sync("k", lambda: ran.append("g") or "g"))
    else:
        import asyncio

        async def work() -> str:
            ran.append("g")
            return "g"

        caller = Background(lambda: asyncio.run(g.run("k", work)))
    assert reached.wait(10)  # the scope answered LEAD; the work has not started
    Background(g.close).wait(20)
    closed.set()
    with pytest.raises(GroupClosedError):
        caller.wait()
    caller.thread.join(10)
    assert ran == [], "the work started after close() returned"
    # The lead went back: another group of the key leads it (at once, or once the
    # closed group's lease runs out where its loop could not tell Redis).
    result = other.run_sync("k", lambda: "other", timeout=20)
    assert (result.value, result.joined) == ("other", False)
