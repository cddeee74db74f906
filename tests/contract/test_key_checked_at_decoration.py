"""A ``key`` function that cannot take every call of the function it keys is refused
when the function is decorated (issue 29, ADR 0044): a TypeError at import naming both
signatures, instead of a TypeError at the first call that passes an argument the key
does not take."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flightgroup import FlightGroup, GroupSlot


def user(user_id: int) -> int:
    return user_id


def page(query: str, limit: int = 10, *, cursor: str | None = None) -> str:
    return query


@pytest.mark.parametrize(
    ("key", "fn"),
    [
        (lambda uid: str(uid), user),  # another name: user(user_id=7) fails in the key
        (lambda: "all", user),  # too few
        (lambda user_id, extra: "", user),  # too many
        (lambda query, limit: query, page),  # the key requires what the function defaults
        (lambda query, limit=10: query, page),  # the key takes no cursor=
    ],
    ids=["renamed", "too-few", "too-many", "required-default", "no-keyword-only"],
)
@pytest.mark.parametrize("declare_on", ["group", "slot"])
def test_a_key_that_cannot_take_a_call_is_refused_at_decoration(
    key: Callable[..., str], fn: Callable[..., Any], declare_on: str
) -> None:
    """TypeError when decorating, naming both signatures."""
    on = FlightGroup() if declare_on == "group" else GroupSlot()
    with pytest.raises(TypeError, match=r"the key function\(.*\) cannot take every call of"):
        on.coalesce(key=key)(fn)


@pytest.mark.parametrize(
    "key",
    [
        lambda query, limit=10, *, cursor=None: query,
        lambda query, limit=0, **rest: query,
        lambda *args, **kwargs: repr(args),
    ],
    ids=["same-parameters", "named-rest", "takes-anything"],
)
def test_a_key_that_takes_every_call_is_accepted(key: Callable[..., str]) -> None:
    """The same parameters, or catch-alls, pass; the function keeps working."""
    with FlightGroup() as group:
        coalesced = group.coalesce(key=key)(page)
        assert coalesced("q", 5, cursor="c") == "q"
        assert coalesced(query="q") == "q"


def test_methods_and_classmethods_are_checked_with_their_first_parameter() -> None:
    """A method's key takes self first, a classmethod's cls; a missing one is refused."""
    group = FlightGroup()

    class Repo:
        @group.coalesce(key=lambda self, n: str(n))
        def get(self, n: int) -> int:
            return n

        @group.coalesce(key=lambda cls, n: str(n))
        @classmethod
        def load(cls, n: int) -> int:
            return n

    assert Repo().get(2) == 2 and Repo.load(3) == 3
    with pytest.raises(TypeError):

        class Broken:
            @group.coalesce(key=lambda n: str(n))
            def get(self, n: int) -> int:
                return n
