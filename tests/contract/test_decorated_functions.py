"""Decorated functions' namespaces (ADR 0032): a decorated function's keys live in its
qualified name; a lambda's adds a digest of its code and where it starts, so two
lambdas never share flights and one lambda shares them in every process. A callable
without a qualified name needs name=; a sync call whose work returns an awaitable names
the work.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from typing import Any

import pytest

from flightgroup import FlightGroup, Retention

KEEP = Retention(success=60.0)  # a call of a shared namespace would get the kept value


def test_two_decorated_lambdas_never_share_a_flight(g: FlightGroup) -> None:
    """Two decorated lambdas never share a flight.

    Every lambda of a scope has the qualified name ``<lambda>``; a lambda's namespace adds where
    its source starts: its line, and its column for lambdas that share a line, so a caller of one
    never gets the other's value."""
    # fmt: off
    price, stock = g.coalesce(key=str, retention=KEEP)(lambda sku: f"price of {sku}"), g.coalesce(key=str, retention=KEEP)(lambda sku: f"stock of {sku}")  # noqa: E501
    # fmt: on
    size = g.coalesce(key=str, retention=KEEP)(lambda sku: f"size of {sku}")
    assert (price("42"), stock("42"), size("42")) == ("price of 42", "stock of 42", "size of 42")
    assert price("42") == "price of 42"  # its own kept value


def _decorated_in(g: FlightGroup, who: str) -> Any:
    return g.coalesce(key=str, retention=KEEP)(lambda sku: f"{who}: {sku}")


def test_one_lambda_has_one_namespace_in_every_group(pair: Any) -> None:
    """One lambda has one namespace in every group and process that runs its source.

    The same lambda's namespace is the same in every group (and process) that runs
    its source, so a wide scope's groups share its flights as any decorated function's."""
    a, b = pair
    assert _decorated_in(a, "a")("42") == "a: 42"
    assert _decorated_in(b, "b")("42") == "a: 42"  # b got a's kept outcome


def test_lambdas_typed_at_a_prompt_never_share_a_flight() -> None:
    """Lambdas typed at a prompt or in notebook cells never share a flight.

    Every line typed at a prompt, or notebook cell, is compiled on its own from line 1
    in ``__main__``: two lambdas there have one qualified name and one line. Their code
    tells them apart."""
    g = FlightGroup()
    here: dict[str, Any] = {"__name__": "__main__", "g": g, "KEEP": KEEP}
    for cell in (
        'price = g.coalesce(key=str, retention=KEEP)(lambda sku: f"price of {sku}")',
        'stock = g.coalesce(key=str, retention=KEEP)(lambda sku: f"stock of {sku}")',
    ):
        exec(compile(cell, "<stdin>", "exec"), here)  # as the interactive prompt does
    assert (here["price"]("42"), here["stock"]("42")) == ("price of 42", "stock of 42")


NAMESPACES = """
from flightgroup.decorator import namespace_of
for cell in (
    "f = lambda s: [x for x in s if x in {'a', 'b', 'c', 'd'}]",
    "f = lambda s: [x for x in s if x in {'a', 'b', 'c', 'e'}]",
    "f = lambda s: [x for x in s if x in {'a', 'b', 'c', 'd'}]",
):
    here = {"__name__": "__main__"}
    exec(compile(cell, "<cell>", "exec"), here)
    print(namespace_of(here["f"]))
"""


def test_a_lambdas_namespace_is_the_same_in_every_process() -> None:
    """A lambda's namespace is the same in every process, never hash- or address-bound.

    A wide scope's processes must compute one lambda's namespace alike: nothing in it
    may follow an address or the string hash (a frozenset constant's order does)."""
    seen = []
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", NAMESPACES],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        seen.append(done.stdout.split())
    first, other, same = seen[0]
    assert first.startswith("__main__.<lambda>@1:")
    assert first != other and first == same  # the code, not the object, names it
    assert seen[1] == seen[0] and seen[2] == seen[0]


def _plain(sku: str) -> str:
    return sku


def test_a_callable_without_a_qualified_name_needs_name() -> None:
    """Decorating a callable without a qualified name needs name=."""
    g = FlightGroup()
    with pytest.raises(TypeError, match="needs name= for a partial"):
        g.coalesce(key=str)(functools.partial(_plain))
    assert g.coalesce(key=str, name="plain")(functools.partial(_plain))("x") == "x"


def test_a_sync_call_whose_work_returns_an_awaitable_names_the_work() -> None:
    """A decorated sync function that returns an awaitable is named in the error.

    A decorated plain def that returns a coroutine is named in the error, not "the work given to
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
