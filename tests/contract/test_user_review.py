"""A review from a user's side: keys that are str subclasses, and decorated functions
that share a qualified name.

- ``test_a_str_subclass_key_is_the_key_its_characters_spell``: the wide scopes told a
  plain key from a decorated function's ``(namespace, key)`` by ``type(key) is str``,
  so a StrEnum member was unpacked as a pair: a ValueError for most keys, and a
  two-character key silently became another key ("q1" as namespace "q", key "1"), so
  two processes calling "q1" both led it at once.
- ``test_two_decorated_lambdas_never_share_a_flight``: a decorated function's keys
  live in ``module.qualname``; every lambda of a scope has the same one, so two
  decorated lambdas shared flights and a caller got the other's value (API.md: two
  decorated functions never share a flight). A lambda's namespace now adds where its
  source starts. The functions one factory makes share a qualified name too; that is
  documented (docs/process-scope.md, ADR 0032).
"""

from __future__ import annotations

import enum
import functools
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from flightgroup import FlightGroup, Retention

from ..infleet import never
from ..ingroup import scope_groups
from ..support import in_thread, outcome, wait_until


class Report(enum.StrEnum):
    DAILY = "daily"
    Q1 = "q1"

    def __str__(self) -> str:  # what a subclass's str() says is not the key
        return f"Report.{self.name}"


class Named(str):
    pass


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


KEEP = Retention(success=60.0)  # a call of a shared namespace would get the kept value


def test_two_decorated_lambdas_never_share_a_flight(g: FlightGroup) -> None:
    """Every lambda of a scope has the qualified name ``<lambda>``: two decorated ones
    shared one namespace, and a caller of one got the other's value. A lambda's
    namespace adds where its source starts: its line, and its column for lambdas that
    share a line."""
    # fmt: off
    price, stock = g.coalesce(key=str, retention=KEEP)(lambda sku: f"price of {sku}"), g.coalesce(key=str, retention=KEEP)(lambda sku: f"stock of {sku}")  # noqa: E501
    # fmt: on
    size = g.coalesce(key=str, retention=KEEP)(lambda sku: f"size of {sku}")
    assert (price("42"), stock("42"), size("42")) == ("price of 42", "stock of 42", "size of 42")
    assert price("42") == "price of 42"  # its own kept value


def _decorated_in(g: FlightGroup, who: str) -> Any:
    return g.coalesce(key=str, retention=KEEP)(lambda sku: f"{who}: {sku}")


def test_one_lambda_has_one_namespace_in_every_group(pair: Any) -> None:
    """The same lambda's namespace is the same in every group (and process) that runs
    its source, so a wide scope's groups share its flights as any decorated function's."""
    a, b = pair
    assert _decorated_in(a, "a")("42") == "a: 42"
    assert _decorated_in(b, "b")("42") == "a: 42"  # b got a's kept outcome


def test_lambdas_typed_at_a_prompt_never_share_a_flight() -> None:
    """Every line typed at a prompt, or notebook cell, is compiled on its own from line 1
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
from flightgroup.group import _namespace_of
for cell in (
    "f = lambda s: [x for x in s if x in {'a', 'b', 'c', 'd'}]",
    "f = lambda s: [x for x in s if x in {'a', 'b', 'c', 'e'}]",
    "f = lambda s: [x for x in s if x in {'a', 'b', 'c', 'd'}]",
):
    here = {"__name__": "__main__"}
    exec(compile(cell, "<cell>", "exec"), here)
    print(_namespace_of(here["f"]))
"""


def test_a_lambdas_namespace_is_the_same_in_every_process() -> None:
    """A wide scope's processes must compute one lambda's namespace alike: nothing in it
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


@pytest.mark.parametrize("scope", ["directory", "fleet"])
def test_a_str_subclass_key_meets_its_plain_key_across_groups(
    request: pytest.FixtureRequest, scope: str
) -> None:
    """Two groups of one scope meet only in the scope (each has its own table): a
    two-character StrEnum key was sent as another key there, so both led."""
    a, b = scope_groups(request, scope, 2, lease=5.0)
    gate, started = threading.Event(), threading.Event()

    def work(name: str) -> str:
        started.set()
        assert gate.wait(10)
        return name

    @a.coalesce(key=lambda report: report, name="reports")
    def build_a(report: str) -> str:
        return work("a")

    @b.coalesce(key=lambda report: report, name="reports")
    def build_b(report: str) -> str:
        raise AssertionError("a joiner's work never runs")

    try:
        for lead, join in [
            (lambda: a.run_sync(Report.Q1, lambda: work("a")).value, lambda j: b.run_sync(
                "q1", never, on_join=j).joined),
            (lambda: build_a(Report.Q1), None),
        ]:
            gate.clear()
            started.clear()
            leader, led = in_thread(lead)
            assert started.wait(10)
            if join is not None:
                joined = threading.Event()
                joiner, got = in_thread(join, joined.set)
                assert joined.wait(10)
            else:  # the decorated twin in the other group, with the plain key
                joiner, got = in_thread(build_b, "q1")
                wait_until(lambda: b.stats().joins == 2, "the decorated call joins")
            gate.set()
            leader.join(10)
            joiner.join(10)
            assert outcome(led) == "a"
            assert outcome(got) in (True, "a"), got
    finally:
        a.close()
        b.close()
