"""docs/api.md, item by item: each test names the line of the contract it pins."""

from __future__ import annotations

import inspect
import os
import threading
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from flightgroup import JSON, FlightFailedError, FlightGroup, Limits, Retention, Retry

REDIS = "redis://127.0.0.1:6379/0"  # the machine's Redis (docs/api.md's fleet scope)


@pytest.fixture(params=["directory", "fleet"])
def wide(request: pytest.FixtureRequest, directory: str) -> Iterator[dict[str, Any]]:
    """The keyword arguments of a wide group: a fresh directory, or a fresh namespace."""
    if request.param == "directory":
        yield {"directory": directory, "codec": JSON}
    else:
        yield {"redis": REDIS, "namespace": f"contract{uuid.uuid4().hex[:12]}", "codec": JSON}


# -- contract items nobody pinned yet (these pass) ------------------------------------


def test_policy_defaults_are_the_contracts() -> None:
    # docs/api.md "Policies": Retry(attempts=3, backoff=0.1, max_backoff=5.0, jitter=True,
    # on=(Exception,), on_timeout=True); Retention(success=30.0, error=None,
    # max_items=10_000, max_bytes=None); Limits(max_waiters=None, max_flights=None).
    assert Retry() == Retry(3, 0.1, 5.0, True, (Exception,), True)
    assert Retention() == Retention(30.0, None, 10_000, None)
    assert Limits() == Limits(None, None)


def test_call_options_are_keyword_only_with_the_contracts_defaults() -> None:
    # docs/api.md "Calls": run(key, work, *, on_join=None, timeout=None, fresh=False).
    for method in (FlightGroup.run, FlightGroup.run_sync):
        params = inspect.signature(method).parameters
        assert list(params)[:3] == ["self", "key", "work"]
        for name, default in (("on_join", None), ("timeout", None), ("fresh", False)):
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
            assert params[name].default is default


# -- deviations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "wide",
    [
        "directory",
        "fleet",
    ],
    indirect=True,
)
def test_a_wide_scope_evicts_kept_outcomes_past_max_items(wide: dict[str, Any]) -> None:
    g = FlightGroup(retention=Retention(success=60.0, max_items=1), **wide)
    try:
        g.run_sync("a", lambda: 1)
        g.run_sync("b", lambda: 2)  # the store holds one item: "a" is evicted
        again = g.run_sync("a", lambda: 3)
        assert (again.value, again.joined) == (3, False)
    finally:
        g.close()


@pytest.mark.parametrize(
    "wide",
    [
        "directory",
        "fleet",
    ],
    indirect=True,
)
def test_a_wide_scope_keeps_nothing_over_max_bytes(wide: dict[str, Any]) -> None:
    g = FlightGroup(retention=Retention(success=60.0, max_bytes=10), **wide)
    try:
        g.run_sync("k", lambda: "x" * 100)  # 102 bytes encoded: over max_bytes alone
        again = g.run_sync("k", lambda: "new")
        assert (again.value, again.joined) == ("new", False)
    finally:
        g.close()


def test_a_joiner_in_another_group_of_the_leaders_process_has_the_error_as_cause(
    wide: dict[str, Any],
) -> None:
    # docs/api.md, Outcomes: "joiner | the work raised E | FlightFailedError ...; in the same
    # process __cause__ is E": a joiner in another group of the process has it too, not
    # only the joiners of the leader's own group.
    a, b = FlightGroup(**wide), FlightGroup(**wide)
    try:
        original = KeyError("missing")
        started, release, joined = threading.Event(), threading.Event(), threading.Event()

        def boom() -> None:
            started.set()
            release.wait(20)
            raise original

        def lead() -> None:
            with pytest.raises(KeyError):
                a.run_sync("k", boom)

        got: list[BaseException] = []

        def join() -> None:
            try:
                b.run_sync("k", lambda: "never", on_join=joined.set)
            except FlightFailedError as exc:
                got.append(exc)

        leader = threading.Thread(target=lead)
        leader.start()
        assert started.wait(20)
        joiner = threading.Thread(target=join)
        joiner.start()
        assert joined.wait(20)  # b joined a's flight in the scope
        release.set()
        leader.join(20)
        joiner.join(20)
        assert len(got) == 1 and got[0].__cause__ is original
    finally:
        a.close()
        b.close()


def test_a_kept_failure_in_the_leaders_process_has_the_error_as_cause(
    wide: dict[str, Any],
) -> None:
    g = FlightGroup(retention=Retention(success=None, error=60.0), **wide)
    try:
        original = KeyError("missing")

        def boom() -> None:
            raise original

        with pytest.raises(KeyError):
            g.run_sync("k", boom)
        with pytest.raises(FlightFailedError) as caught:
            g.run_sync("k", lambda: "never")
        assert caught.value.error_type == "KeyError"  # served from the kept failure
        assert caught.value.__cause__ is original
    finally:
        g.close()


def test_a_failures_message_crosses_the_wide_scope_whole(wide: dict[str, Any]) -> None:
    # docs/api.md (Outcomes): FlightFailedError has '.message (its str())', whole (past 8,192
    # characters too). Served here from the kept failure, so it crossed the store.
    text = "m" * 10_000
    g = FlightGroup(retention=Retention(success=None, error=60), **wide)
    try:

        def boom() -> None:
            raise ValueError(text)

        with pytest.raises(ValueError, match=r"^m+$"):
            g.run_sync("k", boom)
        with pytest.raises(FlightFailedError) as caught:
            g.run_sync("k", lambda: "never")
        assert caught.value.message == text
    finally:
        g.close()


def test_only_a_message_past_max_value_bytes_is_cut(wide: dict[str, Any]) -> None:
    # max_value_bytes bounds what a landing carries; a message whose UTF-8 passes it is
    # cut to a quarter as many characters (each takes at most 4 bytes), and says so.
    g = FlightGroup(retention=Retention(success=None, error=60), max_value_bytes=4096, **wide)
    try:

        def boom(text: str) -> None:
            raise ValueError(text)

        for key, text, served in (
            ("fits", "é" * 2048, "é" * 2048),  # 4,096 bytes: whole
            ("over", "é" * 2049, "é" * 1024 + "... (cut)"),
        ):
            with pytest.raises(ValueError):
                g.run_sync(key, lambda text=text: boom(text))  # type: ignore[misc]
            with pytest.raises(FlightFailedError) as caught:
                g.run_sync(key, lambda: "never")
            assert caught.value.message == served
    finally:
        g.close()


def test_a_forked_childs_group_rejects_calls_with_the_closed_groups_message(
    directory: str,
) -> None:
    g = FlightGroup(directory=directory, codec=JSON)
    try:
        g.run_sync("k", lambda: 1)  # started: its thread runs in this process
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads
            pid = os.fork()
        if pid == 0:  # the child: report what a call raises, and leave at once
            code = 0
            try:
                try:
                    g.run_sync("k2", lambda: 2)
                    said = "no error"
                except Exception as exc:
                    said = f"{type(exc).__name__}: {exc}"
                os.write(write, said.encode())
            except BaseException:
                code = 1
            os._exit(code)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        said = os.read(read, 4096).decode()
        os.close(read)
        assert os.waitstatus_to_exitcode(status) == 0
        assert said == "GroupClosedError: This flight group is closed."
    finally:
        g.close()


def test_the_directory_top_level_holds_only_the_named_files(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = {"flight.lock", "flight.epoch", "flight.sock"}
    others: set[str] = set()
    real_replace = os.replace

    def looking_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        # Every durable write renames a finished file into place: look at the top level.
        if os.path.isdir(directory):
            for entry in os.scandir(directory):
                if not entry.is_dir(follow_symlinks=False) and entry.name not in named:
                    others.add(entry.name)
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", looking_replace)
    g = FlightGroup(directory=directory, codec=JSON)
    try:
        assert g.run_sync("k", lambda: 1).value == 1  # the first term writes its epoch
    finally:
        g.close()
    assert others == set()
