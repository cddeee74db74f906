"""max_frame_bytes in the directory scope and the bounds it sets: a value bound no frame
can carry is refused, a key too long for every request a call may send is refused at the
call (and at forget), a failure's message crosses whole or is cut to fit, and an answer or
a landing over a group's own limit fails only the call it answers: the connection stays,
and no flight led on it loses its lease."""

from __future__ import annotations

import threading

import pytest

from flightgroup import Retention, ValueTooLargeError

from ..ingroup import arbiter, close, coordinating, group

pytestmark = pytest.mark.timeout(60)

BIG = "x" * 200_000  # JSON: 200,002 bytes, over the small group's frame
SMALL_FRAME = 100_000


def test_a_joiner_whose_frame_is_too_small_for_the_value_fails_alone(directory: str) -> None:
    coordinator = coordinating(directory)
    leader = group(directory)
    small = group(directory, max_frame_bytes=SMALL_FRAME, reconnect_timeout=1.0)
    running, joined, release_held = threading.Event(), threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def big() -> str:
        running.set()
        assert joined.wait(20)
        return BIG

    def held() -> str:
        assert release_held.wait(30)
        return "held value"

    leading = threading.Thread(target=lambda: results.update(big=leader.run_sync("k", big)))
    holding = threading.Thread(target=lambda: results.update(held=small.run_sync("h", held)))
    try:
        holding.start()  # the small group leads "h" all along: its lease must stay
        assert small.run_sync("warm", lambda: 0).value == 0
        connections = arbiter(small)._channel
        assert connections is not None
        leading.start()
        assert running.wait(20)
        with pytest.raises(ValueTooLargeError) as raised:
            small.run_sync("k", lambda: "joiner ran", on_join=joined.set)
        assert (raised.value.key, raised.value.size, raised.value.limit) == (
            "k", len(BIG) + 2, SMALL_FRAME)
        leading.join(20)
        assert results["big"].value == BIG  # type: ignore[attr-defined]
        # Nothing else of the small group was touched: the same connection, its lead
        # of "h" lands with its value, and its next calls are served.
        assert arbiter(small)._channel is connections
        assert small.run_sync("after", lambda: "served").value == "served"
        release_held.set()
        holding.join(20)
        assert results["held"].value == "held value"  # type: ignore[attr-defined]
        assert arbiter(small)._channel is connections
    finally:
        release_held.set()
        joined.set()
        close(small, leader, coordinator)


def test_a_kept_value_over_the_frame_fails_that_call_and_the_next_ones_work(
    directory: str,
) -> None:
    keep = Retention(success=60.0)
    coordinator = coordinating(directory, retention=keep)
    small = group(directory, max_frame_bytes=SMALL_FRAME, reconnect_timeout=1.0)
    try:
        assert coordinator.run_sync("k", lambda: BIG).value == BIG  # kept for 60 s
        assert small.run_sync("warm", lambda: 0).value == 0
        connections = arbiter(small)._channel
        for _ in range(3):  # each time only that call fails, and the key stays kept
            with pytest.raises(ValueTooLargeError):
                small.run_sync("k", lambda: "small ran")
        assert small.run_sync("other", lambda: "served").value == "served"
        assert arbiter(small)._channel is connections
        assert coordinator.run_sync("k", lambda: "again").value == BIG
    finally:
        close(small, coordinator)


def test_the_error_of_a_decorated_call_names_the_key_as_called(directory: str) -> None:
    keep = Retention(success=60.0)
    coordinator = coordinating(directory, retention=keep)
    small = group(directory, max_frame_bytes=SMALL_FRAME)
    try:
        @coordinator.coalesce(key=lambda k: k, name="op")
        def big(k: str) -> str:
            return BIG

        @small.coalesce(key=lambda k: k, name="op")
        def small_op(k: str) -> str:
            return "small ran"

        assert big("k") == BIG  # kept under the operation's namespace
        with pytest.raises(ValueTooLargeError) as raised:
            small_op("k")
        # Not the key as sent (NUL, the namespace, NUL, the key).
        assert (raised.value.key, raised.value.size) == ("k", len(BIG) + 2)
        assert "'k'" in str(raised.value)
    finally:
        close(small, coordinator)
