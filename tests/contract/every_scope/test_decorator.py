"""docs/api.md, Calls: the decorator. Calls with one key share a flight and return the value
itself; keys live in a namespace of the function's own, so two decorated functions (or a
function and a plain key) never share a flight; ``forget`` on the wrapper."""

from __future__ import annotations

import threading
from typing import Any

from flightgroup import FlightGroup

from ...ingroup import Background
from ...support import run, wait_until


def test_concurrent_calls_of_one_key_share_a_run_and_return_the_value(
    group: FlightGroup,
) -> None:
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    @group.coalesce(key=lambda n: f"n:{n}")
    def slow(n: int) -> dict[str, int]:
        ran.append(n)
        started.set()
        assert release.wait(30)
        return {"n": n}

    first = Background(lambda: slow(1))
    assert started.wait(15)
    second = Background(lambda: slow(1))
    wait_until(lambda: group.stats().joins == 1, "the second call joined")
    release.set()
    assert first.wait() == second.wait() == {"n": 1}
    assert ran == [1]


def test_an_async_function_keeps_being_awaited(group: FlightGroup) -> None:
    @group.coalesce(key=lambda n: str(n))
    async def square(n: int) -> int:
        return n * n

    assert run(square(4)) == 16


def test_two_functions_with_equal_keys_never_share_a_flight(group: FlightGroup) -> None:
    started, release = threading.Event(), threading.Event()

    @group.coalesce(key=lambda: "same")
    def first() -> str:
        started.set()
        assert release.wait(30)
        return "first"

    @group.coalesce(key=lambda: "same", name="second")
    def second() -> str:
        return "second"

    running = Background(first)
    assert started.wait(15)
    assert second() == "second"  # its own namespace: no join of first's flight
    assert group.run_sync("same", lambda: "plain").value == "plain"  # nor a plain key
    release.set()
    assert running.wait() == "first"


def test_the_namespace_is_the_functions_qualified_name_or_its_name(group: FlightGroup) -> None:
    def plain(x: Any) -> Any:
        return x

    assert group.coalesce()(plain).flight_namespace.endswith("plain")
    assert group.coalesce(name="mine")(plain).flight_namespace == "mine"
