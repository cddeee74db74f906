"""max_frame_bytes in the directory scope and the bounds it sets: a value bound no frame
can carry is refused, a key too long for every request a call may send is refused at the
call (and at forget), a failure's message crosses whole or is cut to fit, and an answer or
a landing over a group's own limit fails only the call it answers: the connection stays,
and no flight led on it loses its lease."""

from __future__ import annotations

import logging
import threading

import pytest

from flightgroup import (
    JSON,
    FlightFailedError,
    FlightGroup,
    FlightInterruptedError,
    Result,
    Retention,
    ValueTooLargeError,
)

from ..ingroup import arbiter, close, coordinating, group
from ..support import scope_of, wait_until

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
        connections = arbiter(small)._state.channel
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
        assert arbiter(small)._state.channel is connections
        assert small.run_sync("after", lambda: "served").value == "served"
        release_held.set()
        holding.join(20)
        assert results["held"].value == "held value"  # type: ignore[attr-defined]
        assert arbiter(small)._state.channel is connections
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
        connections = arbiter(small)._state.channel
        for _ in range(3):  # each time only that call fails, and the key stays kept
            with pytest.raises(ValueTooLargeError):
                small.run_sync("k", lambda: "small ran")
        assert small.run_sync("other", lambda: "served").value == "served"
        assert arbiter(small)._state.channel is connections
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


def test_a_value_bound_that_no_frame_can_carry_is_refused(directory: str) -> None:
    """A max_value_bytes that no frame of max_frame_bytes can carry is refused."""
    with pytest.raises(ValueError, match="max_value_bytes"):
        FlightGroup(directory=directory, codec=JSON, max_value_bytes=1 << 20,
                    max_frame_bytes=1 << 20)
    FlightGroup(directory=directory, codec=JSON, max_value_bytes=(1 << 20) - (64 << 10),
                max_frame_bytes=1 << 20).close()


@pytest.mark.timeout(60)
def test_a_smaller_frame_makes_the_default_value_bound_fit(directory: str) -> None:
    """A smaller max_frame_bytes brings the default value bound under it."""
    # A value as big as the frame would make every coordinator drop the leader's
    # connection at each landing, sent again on each reconnect, for ever.
    group = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=1 << 20)
    try:
        with pytest.raises(ValueTooLargeError):
            group.run_sync("big", lambda: "x" * (1 << 20))
        assert group.run_sync("big", lambda: "small").value == "small"  # the key is free
    finally:
        group.close()


@pytest.mark.timeout(60)
def test_a_failure_message_crosses_processes_whole(directory: str) -> None:
    """A failure's message crosses processes whole (FlightFailedError.message)."""
    # docs/api.md: FlightFailedError's .message is the error's str(), whole (past 8,192 too).
    leader, joiner = (FlightGroup(directory=directory, codec=JSON) for _ in range(2))
    running, joined = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        running.set()  # the coordinator made this group lead: a call now joins
        assert joined.wait(20)
        raise ValueError("é" * 100_000)

    def lead() -> None:
        with pytest.raises(ValueError):
            leader.run_sync("k", work)

    try:
        lead_thread = threading.Thread(target=lead)
        lead_thread.start()
        assert running.wait(20)
        try:
            joiner.run_sync("k", lambda: None, on_join=joined.set)
        except FlightFailedError as exc:
            errors.append(exc)
        lead_thread.join(30)
    finally:
        leader.close()
        joiner.close()
    (error,) = errors
    assert isinstance(error, FlightFailedError)
    assert error.error_type == "ValueError"
    assert error.message == "é" * 100_000


@pytest.mark.timeout(60)
def test_a_landing_over_the_coordinators_frame_is_not_sent_for_ever(
    directory: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A landing over the coordinator's frame limit lands interrupted and frees the key.

    A group with a smaller max_frame_bytes coordinates: the coordinator says its limit as it
    closes the connection of a leader whose landing is over it; the leader lands 'interrupted'
    instead (never sends the landing again on every reconnect), and the key is free for the next
    call."""
    coordinator = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=1 << 20)
    leader, joiner = (FlightGroup(directory=directory, codec=JSON) for _ in range(2))
    running, joined = threading.Event(), threading.Event()
    big = "x" * (2 << 20)

    def work() -> str:
        running.set()
        assert joined.wait(20)
        return big

    results: list[object] = []
    try:
        coordinator.run_sync("warm", lambda: 0)  # it coordinates: frames up to 1 MiB
        thread = threading.Thread(target=lambda: results.append(leader.run_sync("k", work)))
        thread.start()
        assert running.wait(20)
        with pytest.raises(FlightInterruptedError):
            joiner.run_sync("k", lambda: "joiner ran", on_join=joined.set)
        thread.join(20)
        # The leader has its own value. It reconnects, reasserts the flight and lands it
        # "interrupted"; once that landing is acknowledged (the lead gone, its key lock
        # freed), the key is free for a new flight. (A call before then would wait for
        # the key lock and join the reasserted flight, as it must.)
        (result,) = results
        assert isinstance(result, Result) and result.value == big and not result.joined
        leads = scope_of(leader)._state.leads
        wait_until(lambda: not leads, "the leader's landing acknowledged")
        after = joiner.run_sync("k", lambda: "next")
        assert (after.value, after.joined) == ("next", False)
    finally:
        for group in (leader, joiner, coordinator):
            group.close()
    said = [r for r in caplog.records if "over the coordinator's max_frame_bytes" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]


@pytest.mark.timeout(60)
def test_a_failure_over_a_small_frame_is_cut_and_spares_the_other_flights(
    directory: str,
) -> None:
    """A failure over a small frame is cut to fit and spares the other flights.

    With a small max_frame_bytes, a failure's message is cut to fit the landing, so the
    coordinator takes it and keeps the leader's connection; the other flight lands for its
    joiner."""
    leader = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=4096)
    joiner = FlightGroup(directory=directory, codec=JSON)
    running = {k: threading.Event() for k in ("k1", "k2")}
    joined = {k: threading.Event() for k in ("k1", "k2")}
    led: dict[str, object] = {}
    got: dict[str, object] = {}

    def work(key: str) -> str:
        running[key].set()
        assert joined[key].wait(20)
        if key == "k2":
            raise RuntimeError("x" * 5000)
        return f"{key} value"

    def call(group: FlightGroup, key: str, into: dict[str, object], **kw: object) -> None:
        try:
            into[key] = group.run_sync(key, lambda: work(key), **kw).value  # type: ignore[arg-type]
        except BaseException as exc:
            into[key] = exc

    threads = []
    try:
        for key in ("k1", "k2"):
            threads.append(threading.Thread(target=call, args=(leader, key, led)))
            threads[-1].start()
            assert running[key].wait(20)
            threads.append(threading.Thread(target=call, args=(joiner, key, got),
                                            kwargs={"on_join": joined[key].set}))
            threads[-1].start()
        for thread in threads:
            thread.join(30)
    finally:
        leader.close()
        joiner.close()
    assert led["k1"] == got["k1"] == "k1 value"
    assert isinstance(led["k2"], RuntimeError)
    failed = got["k2"]
    assert isinstance(failed, FlightFailedError) and failed.error_type == "RuntimeError"
    assert failed.message.endswith("... (cut)") and failed.message.startswith("x" * 100)


def test_a_key_too_long_for_a_frame_is_refused_at_the_call(directory: str) -> None:
    """A key too long for a frame is refused at the call."""
    from flightgroup.directory import wire

    group = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=1024)
    # A key whose plain run fits, but not every request the call may have to send
    # (a fresh run, a rejoin, a reassert after a failover: longer ids and tokens).
    near = "k" * 990
    assert len(wire.run_frame(1, near)) - 4 < 1024 < len(wire.reassert_frame(2**62, near, 2**62))
    try:
        for key in ("k" * 1100, near):
            with pytest.raises(ValueError, match="max_frame_bytes"):
                group.run_sync(key, lambda: 1)
        assert group.run_sync("k", lambda: 2).value == 2
    finally:
        group.close()


@pytest.mark.timeout(60)
def test_forget_of_a_key_too_long_for_a_frame_is_refused_and_changes_nothing(
    directory: str,
) -> None:
    """forget() of a key too long for a frame is refused and changes nothing.

    The key is never sent: the coordinator keeps the connection, a joiner elsewhere of a flight
    this group led is not interrupted, and forget() raises at once instead of UnavailableError
    after its timeout."""
    coordinator = FlightGroup(directory=directory, codec=JSON)
    small = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=1 << 20)
    running, joined, release = threading.Event(), threading.Event(), threading.Event()
    results: list[object] = []

    def work() -> str:
        running.set()
        assert release.wait(20)
        return "led"

    try:
        coordinator.run_sync("warm", lambda: 0)
        leading = threading.Thread(target=lambda: results.append(small.run_sync("k", work)))
        leading.start()
        assert running.wait(20)
        joining = threading.Thread(target=lambda: results.append(
            coordinator.run_sync("k", lambda: "joiner ran", on_join=joined.set)))
        joining.start()
        assert joined.wait(20)
        channel = scope_of(small)._state.channel
        for forget in (small.forget, small.coalesce(key=lambda k: k, name="op")(str).forget):
            with pytest.raises(ValueError, match="max_frame_bytes"):
                forget("k" * (2 << 20))
        assert scope_of(small)._state.channel is channel
        release.set()
        leading.join(20)
        joining.join(20)
        assert sorted((r.value, r.joined) for r in results) == [  # type: ignore[attr-defined]
            ("led", False), ("led", True)]
    finally:
        release.set()
        small.close()
        coordinator.close()
