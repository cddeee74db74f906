"""forget() in a wide scope against a call of its own group made while it runs: the
group forgets the key in its table, then tells the scope. A call that came in between
made a local flight whose request could reach the scope before the forget and join the
old flight; after forget() returned, that local flight stayed in the table until the
scope's notice reached it (a read on the group's thread), so a call made after forget()
returned joined it and got the old outcome, although API.md says the next call leads a
new flight. Found by a chaos soak of the fleet scope (2026-12-01); the directory scope had
the same window. The test puts a call in that window by hand.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from .ingroup import Background
from .support import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_call_after_forget_returned_never_joins_the_old_flight(
    pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, forgetter = pair
    started, release = threading.Event(), threading.Event()

    def old() -> str:
        started.set()
        assert release.wait(20)
        return "old"

    outer = Background(lambda: leader.run_sync("k", old))
    in_between: list[Background] = []
    try:
        assert started.wait(20)
        arbiter = forgetter._arbiter
        real_forget = arbiter.forget

        def forget(*args: Any, **kwargs: Any) -> Any:
            # A call of this group between its table's forget and the scope's: it asks
            # the scope first, and joins the old flight.
            call = Background(lambda: forgetter.run_sync("k", lambda: "between"))
            in_between.append(call)
            wait_until(lambda: forgetter.stats().joins >= 1, "the call joined the old flight")
            return real_forget(*args, **kwargs)

        monkeypatch.setattr(arbiter, "forget", forget)
        forgetter.forget("k")
        monkeypatch.undo()
        after = Background(lambda: forgetter.run_sync("k", lambda: "new"))
        # The directory's new leader waits for the old flight's key lock: let it end.
        release.set()
        result = after.wait()
        assert (result.value, result.joined) == ("new", False), result
        assert outer.wait().value == "old"
        assert in_between[0].wait().value == "old"  # it did join the old flight
    finally:
        release.set()
