"""A review from a user's side: keys that are str subclasses, and decorated functions
that share a qualified name.

- ``test_a_str_subclass_key_is_the_key_its_characters_spell``: the wide scopes told a
  plain key from a decorated function's ``(namespace, key)`` by ``type(key) is str``,
  so a StrEnum member was unpacked as a pair: a ValueError for most keys, and a
  two-character key silently became another key ("q1" as namespace "q", key "1"), so
  two processes calling "q1" both led it at once.
- ``test_two_live_functions_with_one_qualified_name_are_refused``: a decorated
  function's keys live in ``module.qualname``; every function one factory makes (and
  every lambda of a module) has the same one, so they shared flights and a caller got
  another function's value (API.md: two decorated functions never share a flight).
"""

from __future__ import annotations

import enum
import functools
import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flightgroup import FlightGroup

from .infleet import never
from .ingroup import scope_groups
from .support import in_thread, outcome


class Report(enum.StrEnum):
    DAILY = "daily"
    Q1 = "q1"

    def __str__(self) -> str:  # what a subclass's str() says is not the key
        return f"Report.{self.name}"


class Named(str):
    pass


@pytest.fixture(params=["process", "directory", "fleet"])
def g(request: pytest.FixtureRequest) -> Iterator[FlightGroup]:
    [made] = scope_groups(request, request.param, 1, lease=5.0)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("key", [Report.DAILY, Report.Q1, Named("q1")], ids=str)
def test_a_str_subclass_key_is_the_key_its_characters_spell(g: FlightGroup, key: str) -> None:
    gate, started = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert gate.wait(10)
        return "v"

    leader, led = in_thread(g.run_sync, key, work)
    assert started.wait(10)
    joined = threading.Event()
    # the plain str of the same characters joins the subclass's flight, in every scope
    joiner, got = in_thread(g.run_sync, str.__str__(key), never, on_join=joined.set)
    assert joined.wait(10)
    gate.set()
    leader.join(10)
    joiner.join(10)
    assert (outcome(led).value, outcome(got).value, outcome(got).joined) == ("v", "v", True)
    g.forget(key)
    assert g.run_sync(str.__str__(key), lambda: "after").value == "after"


def _factory(g: FlightGroup, tenant: str) -> Any:
    @g.coalesce(key=lambda item: f"item:{item}")
    def fetch(item: int) -> str:
        return f"{tenant}/{item}"

    return fetch


def test_two_live_functions_with_one_qualified_name_are_refused() -> None:
    g = FlightGroup()
    fetch_a = _factory(g, "a")
    with pytest.raises(ValueError, match="give each its own name="):
        _factory(g, "b")
    # the same function decorated again, or another group, is not another function
    namespace = g.coalesce(key=str)(_plain).flight_namespace
    assert g.coalesce(key=str)(_plain).flight_namespace == namespace
    assert FlightGroup().coalesce(key=lambda item: str(item))(fetch_a.__wrapped__)
    # lambdas share one qualified name too
    price = g.coalesce(key=str)(lambda sku: f"price of {sku}")
    with pytest.raises(ValueError, match=r"<locals>\.<lambda>'"):
        g.coalesce(key=str)(lambda sku: f"stock of {sku}")
    assert price("42") == "price of 42"
    # name= tells them apart
    fetch_b = g.coalesce(key=lambda item: f"item:{item}", name="fetch-b")(
        lambda item: f"b/{item}"
    )
    assert (fetch_a(1), fetch_b(1)) == ("a/1", "b/1")
    # once the first function is gone, its name is free
    del fetch_a
    gc.collect()
    assert _factory(g, "c")(1) == "c/1"


def _plain(sku: str) -> str:
    return sku


def test_a_callable_without_a_qualified_name_needs_name() -> None:
    g = FlightGroup()
    with pytest.raises(TypeError, match="needs name= for a partial"):
        g.coalesce(key=str)(functools.partial(_plain))
    assert g.coalesce(key=str, name="plain")(functools.partial(_plain))("x") == "x"


def test_a_sync_call_whose_work_returns_an_awaitable_names_the_work() -> None:
    """A decorated plain def that returns a coroutine was told "the work given to
    run_sync()", which its caller never called."""
    g = FlightGroup()

    async def fetch(item: int) -> int:
        return item

    @g.coalesce(key=str)
    def get(item: int) -> Any:
        return fetch(item)

    with pytest.raises(TypeError, match=r"the work .*get returned coroutine, an awaitable"):
        get(1)
    with pytest.raises(TypeError, match=r"the work .*fetch returned coroutine"):
        g.run_sync("k", functools.partial(fetch, 1))
