"""Bad input gets a clear error at once and changes nothing."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import pytest

from flightgroup import JSON, FlightGroup, Limits, Retention, Retry

from ..support import run


async def _work() -> str:
    return "v"


BAD_KEYS: list[tuple[Any, type[Exception]]] = [
    ("", ValueError),
    (None, TypeError),
    (7, TypeError),
    (b"bytes", TypeError),
    (("tuple",), TypeError),
]
BAD_TIMEOUTS: list[tuple[Any, type[Exception]]] = [
    (-1, ValueError),
    (-0.001, ValueError),
    (math.nan, ValueError),
    ("1", TypeError),
    (True, TypeError),
]


@pytest.mark.parametrize(("key", "error"), BAD_KEYS)
def test_bad_key_is_refused_by_run_and_run_sync_and_changes_nothing(
    key: Any, error: type[Exception]
) -> None:
    g = FlightGroup()
    with pytest.raises(error, match="key"):
        run(g.run(key, _work))
    with pytest.raises(error, match="key"):
        g.run_sync(key, lambda: 1)
    with pytest.raises(error, match="key"):
        g.forget(key)
    assert g.stats().calls == 0 and g.stats().in_flight == 0


@pytest.mark.parametrize(("timeout", "error"), BAD_TIMEOUTS)
def test_bad_timeout_is_refused(timeout: Any, error: type[Exception]) -> None:
    g = FlightGroup()
    with pytest.raises(error, match="timeout"):
        run(g.run("k", _work, timeout=timeout))
    with pytest.raises(error, match="timeout"):
        g.run_sync("k", lambda: 1, timeout=timeout)
    assert g.stats().calls == 0


def test_infinite_timeout_means_no_limit() -> None:
    g = FlightGroup()
    assert run(g.run("k", _work, timeout=math.inf)).value == "v"
    assert g.run_sync("k", lambda: 2, timeout=math.inf).value == 2


@pytest.mark.parametrize("work", [None, 5, "work"])
def test_non_callable_work_is_refused(work: Any) -> None:
    g = FlightGroup()
    with pytest.raises(TypeError, match="work must be callable"):
        run(g.run("k", work))
    with pytest.raises(TypeError, match="work must be callable"):
        g.run_sync("k", work)
    assert g.stats().calls == 0


def test_non_callable_on_join_and_non_bool_fresh_are_refused() -> None:
    g = FlightGroup()
    with pytest.raises(TypeError, match="on_join"):
        run(g.run("k", _work, on_join=3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fresh"):
        run(g.run("k", _work, fresh=1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fresh"):
        g.run_sync("k", lambda: 1, fresh="yes")  # type: ignore[arg-type]


def test_construction_checks_its_arguments_and_does_no_io(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="exclude"):
        FlightGroup(directory=str(tmp_path), redis="redis://127.0.0.1:6379/0", codec=JSON)
    with pytest.raises(TypeError, match="codec"):
        FlightGroup(directory=str(tmp_path))
    with pytest.raises(TypeError, match="codec"):
        FlightGroup(redis="redis://127.0.0.1:6379/0", namespace="app")
    with pytest.raises(TypeError, match="codec"):
        FlightGroup(codec=object())  # type: ignore[arg-type]
    long_dir = tmp_path / ("d" * 120)
    with pytest.raises(ValueError, match="103"):
        FlightGroup(directory=str(long_dir), codec=JSON)
    assert not long_dir.exists()
    with pytest.raises(ValueError, match="namespace"):
        FlightGroup(redis="redis://127.0.0.1:6379/0", codec=JSON)
    with pytest.raises(ValueError, match="URL"):
        FlightGroup(redis="http://example", namespace="app", codec=JSON)
    with pytest.raises(ValueError, match="deadline"):
        FlightGroup(deadline=-1)
    with pytest.raises(TypeError, match="retry"):
        FlightGroup(retry=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("scope", "argument", "error", "match"),
    [
        # An argument of another scope is refused, not ignored.
        ("process", {"lease": 30.0}, ValueError, "lease belongs to the fleet scope"),
        ("process", {"cluster": True}, ValueError, "cluster belongs to the fleet scope"),
        ("directory", {"lease": 30.0}, ValueError, "lease belongs to the fleet scope"),
        ("directory", {"cluster": True}, ValueError, "cluster belongs to the fleet scope"),
        ("process", {"reconnect_timeout": 1.0}, ValueError, "belongs to the directory scope"),
        ("fleet", {"reconnect_timeout": 1.0}, ValueError, "belongs to the directory scope"),
        ("fleet", {"max_frame_bytes": 4096}, ValueError, "belongs to the directory scope"),
        # A bad value is refused in every scope, before the scope is looked at.
        ("directory", {"lease": -5}, ValueError, "lease must not be negative"),
        ("process", {"lease": 0.0}, ValueError, "lease must be greater than 0"),
        ("directory", {"cluster": "yes"}, TypeError, "cluster must be a bool"),
        ("fleet", {"reconnect_timeout": -1}, ValueError, "reconnect_timeout"),
        ("directory", {"max_value_bytes": "1"}, TypeError, "max_value_bytes must be an int"),
        ("fleet", {"max_value_bytes": 0}, ValueError, "max_value_bytes must be a positive"),
        # It bounds an encoded outcome: the process scope encodes only with a codec.
        ("process", {"max_value_bytes": 5}, ValueError, "max_value_bytes needs a codec"),
    ],
)
def test_an_argument_of_another_scope_or_a_bad_one_is_refused(
    tmp_path: Any, scope: str, argument: dict[str, Any], error: type[Exception], match: str
) -> None:
    wide: dict[str, Any] = {
        "process": {},
        "directory": {"directory": str(tmp_path / "d"), "codec": JSON},
        "fleet": {"redis": "redis://127.0.0.1:6379/0", "namespace": "app", "codec": JSON},
    }[scope]
    with pytest.raises(error, match=match):
        FlightGroup(**wide, **argument)
    assert not (tmp_path / "d").exists()
    # The scope's own arguments, and the defaults given by name, are accepted.
    FlightGroup(**wide, lease=10.0, cluster=False, reconnect_timeout=5.0).close()


@pytest.mark.parametrize(
    ("make", "error", "field"),
    [
        (lambda: Retry(attempts=0), ValueError, "attempts"),
        (lambda: Retry(attempts=1.5), TypeError, "attempts"),
        (lambda: Retry(backoff=-1), ValueError, "backoff"),
        (lambda: Retry(max_backoff=math.nan), ValueError, "max_backoff"),
        (lambda: Retry(backoff=math.inf), ValueError, "backoff"),
        (lambda: Retry(on=("x",)), TypeError, "on"),
        (lambda: Retention(success=-1), ValueError, "success"),
        (lambda: Retention(success=math.inf), ValueError, "success"),
        (lambda: Retention(error=math.inf), ValueError, "error"),
        (lambda: Retention(max_items=1.5), TypeError, "max_items"),
        (lambda: Retry(jitter=1), TypeError, "jitter"),
        (lambda: FlightGroup(deadline=math.inf), ValueError, "deadline"),
        (lambda: FlightGroup(deadline=math.nan), ValueError, "deadline"),
        (lambda: FlightGroup(deadline=0), ValueError, "deadline"),
        (lambda: FlightGroup(deadline="1"), TypeError, "deadline"),
        (lambda: FlightGroup().coalesce(deadline=-1), ValueError, "deadline"),
        (lambda: FlightGroup().coalesce(deadline=math.inf), ValueError, "deadline"),
        (lambda: FlightGroup().coalesce(retry=3), TypeError, "retry"),
        (lambda: FlightGroup().coalesce(limits=Retry()), TypeError, "limits"),
        (lambda: Retention(error=math.nan), ValueError, "error"),
        (lambda: Retention(max_items=0), ValueError, "max_items"),
        (lambda: Retention(max_bytes=0), ValueError, "max_bytes"),
        (lambda: Limits(max_waiters=-1), ValueError, "max_waiters"),
        (lambda: Limits(max_flights=0), ValueError, "max_flights"),
        (lambda: Limits(max_flights="3"), TypeError, "max_flights"),
        (lambda: FlightGroup(on_unavailable="sometimes"), ValueError, "on_unavailable"),
        (lambda: FlightGroup(on_unavailable=None), TypeError, "on_unavailable"),
        (lambda: FlightGroup(on_unavailable=True), TypeError, "on_unavailable"),
        (lambda: FlightGroup().coalesce(on_unavailable="LOCAL"), ValueError, "on_unavailable"),
        (lambda: FlightGroup().coalesce(on_unavailable=1), TypeError, "on_unavailable"),
        (lambda: FlightGroup(takeover=-1), ValueError, "takeover"),
        (lambda: FlightGroup(takeover=1.0), TypeError, "takeover"),
        (lambda: FlightGroup(takeover=True), TypeError, "takeover"),
        (lambda: FlightGroup(takeover=None), TypeError, "takeover"),
        (lambda: FlightGroup().coalesce(takeover=-2), ValueError, "takeover"),
        (lambda: FlightGroup().coalesce(takeover="1"), TypeError, "takeover"),
    ],
)
def test_policies_validate_at_construction_naming_the_field(
    make: Any, error: type[Exception], field: str
) -> None:
    with pytest.raises(error, match=field):
        make()


def test_policies_are_frozen() -> None:
    retry = Retry()
    with pytest.raises(AttributeError):
        retry.attempts = 5  # type: ignore[misc]
    assert Retry(on=ValueError).on == (ValueError,)


def test_closed_group_rejects_before_anything_else_runs() -> None:
    from flightgroup import GroupClosedError

    g = FlightGroup()
    g.close()
    g.close()  # idempotent
    ran: list[int] = []
    with pytest.raises(GroupClosedError, match=r"^This flight group is closed\.$"):
        run(g.run("k", lambda: asyncio.sleep(0, ran.append(1))))
    with pytest.raises(GroupClosedError):
        g.run_sync("k", lambda: ran.append(1))
    assert ran == []


@pytest.mark.parametrize("scope", ["process", "directory", "fleet"])
def test_a_closed_group_refuses_forget(request: pytest.FixtureRequest, scope: str) -> None:
    """forget() of a closed group is refused like a call (a decorated function's too),
    never returns having told nobody."""
    from flightgroup import GroupClosedError

    if scope == "process":
        g = FlightGroup()
    elif scope == "directory":
        g = FlightGroup(directory=request.getfixturevalue("directory"), codec=JSON)
    else:
        g = FlightGroup(redis="redis://127.0.0.1:6379/0", namespace=f"fg-test-{uuid.uuid4().hex}",
                        codec=JSON)

    @g.coalesce(key=str)
    def f(n: int) -> int:
        return n

    assert g.run_sync("k", lambda: 1).value == 1 and f(2) == 2
    g.close()
    with pytest.raises(GroupClosedError):
        g.forget("k")
    with pytest.raises(GroupClosedError):
        f.forget(2)
    with pytest.raises(ValueError):  # a bad key is still a bad key
        g.forget("")
