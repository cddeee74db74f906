"""I6 (ADR 0006) in the wide scopes for a work whose flight already left the table: a sync
work that ran past its deadline (its flight settled with FlightTimeoutError, its work
runs on and, in the directory scope, holds the key lock) and then calls its own key gets
RuntimeError; it never leads a new flight that waits for the key lock the caller itself
holds (directory), nor runs the key again inside its own work (fleet). The same for a
flight that a forget() in another process detached.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import pytest

from flightgroup import JSON, FlightGroup, FlightTimeoutError

from ..ingroup import Background
from ..support import flight_of, scope_of, table_of, wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_work_past_its_deadline_that_calls_its_own_key_raises(wide: Any) -> None:
    """A sync work past its deadline that calls its own key raises RuntimeError."""
    go_on, ended = threading.Event(), threading.Event()
    inner: list[BaseException | str] = []

    def body() -> str:
        if not go_on.is_set():  # the outer run; an inner one, were it let run, returns
            assert go_on.wait(20)
            try:
                inner.append(again())
            except BaseException as exc:
                inner.append(exc)
            finally:
                ended.set()
        return "late"

    again = wide.coalesce(key=lambda: "k", deadline=0.3)(body)
    with pytest.raises(FlightTimeoutError):
        again()  # the flight settled; its work runs on
    go_on.set()
    assert ended.wait(20), "the nested call waited for the key lock its own work holds"
    [error] = inner
    assert isinstance(error, RuntimeError) and "wait for itself" in str(error), error


def test_a_flight_lingers_only_until_its_late_work_returns(wide: Any) -> None:
    """The table holds a flight settled past its deadline only while its work runs on
    (its outcome with it): it lets go when the work returns, whatever else happens."""
    go_on = threading.Event()

    def body() -> str:
        assert go_on.wait(20)
        return "late"

    late = wide.coalesce(key=lambda: "k", deadline=0.3)(body)
    with pytest.raises(FlightTimeoutError):
        late()
    assert len(table_of(wide).lingering) == 1
    go_on.set()
    wait_until(lambda: not table_of(wide).lingering, "the flight lets go once its work returned")


def test_a_work_whose_flight_a_forget_elsewhere_detached_still_raises(
    pair: tuple[Any, Any],
) -> None:
    """Once the notice took the leader's own flight out of its table (ADR 0026), the
    nested call must not lead a flight that waits for the key lock its own flight holds
    (directory), nor run the key again inside its own work (fleet)."""
    leader, forgetter = pair
    go_on, started = threading.Event(), threading.Event()
    runs: list[str] = []

    def work() -> str:
        started.set()
        assert go_on.wait(20)
        with pytest.raises(RuntimeError, match="wait for itself"):
            leader.run_sync("k", lambda: runs.append("inner") or "inner")
        return "outer"

    try:
        outer = Background(lambda: leader.run_sync("k", work))
        assert started.wait(10)
        forgetter.forget("k")
        # The directory's joiners and leader hear it at once; the fleet's leader at its
        # next renewal (the pair's lease is 2 s: within 2/3 s).
        wait_until(lambda: flight_of(leader, "k") is None, "the leader heard the forget")
        go_on.set()
        assert outer.wait().value == "outer"
        assert runs == []
    finally:
        go_on.set()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_work_that_calls_its_own_key_through_another_group_of_the_scope_raises(
    pair: tuple[Any, Any], mode: str
) -> None:
    """Two groups of one process that share a scope (one directory, or one namespace on
    one Redis) are one group (docs/api.md): a work of k that calls k through the other group
    would join its own flight and wait for itself until the deadline: it raises."""
    first, second = pair
    runs: list[str] = []

    async def inner_async() -> str:
        runs.append("inner")
        return "inner"

    async def outer_async() -> str:
        with pytest.raises(RuntimeError, match="wait for itself"):
            await second.run("k", inner_async)
        # through the other group, nested one level further (k calls j calls k)
        async def middle() -> str:
            await second.run("k", inner_async)
            return "middle"

        with pytest.raises(RuntimeError, match="wait for itself"):
            await second.run("j", middle)
        return "outer"

    def outer_sync() -> str:
        with pytest.raises(RuntimeError, match="wait for itself"):
            second.run_sync("k", lambda: runs.append("inner") or "inner")
        return "outer"

    if mode == "sync":
        assert first.run_sync("k", outer_sync).value == "outer"
    else:
        assert asyncio.run(first.run("k", outer_async)).value == "outer"
    assert runs == []
    # the key is not stuck afterwards (fresh: the outer flight's landing may still be on
    # its way, and a plain call would join it)
    assert second.run_sync("k", lambda: "later", fresh=True).value == "later"


def _stranger(first: Any, tmp: str) -> Any:
    """A group of the same kind as ``first`` with another scope: another directory (the
    same one under another name is the same scope), or another namespace on its Redis."""
    fleet = scope_of(first)
    if fleet.kind != "fleet":
        return FlightGroup(directory=os.path.join(tmp, "other"), codec=JSON)
    return FlightGroup(redis=fleet.url, namespace=f"{fleet.namespace}-other", codec=JSON)


def test_a_work_of_k_calls_k_in_another_scope_and_it_runs_there(
    pair: tuple[Any, Any], tmp_path: Any
) -> None:
    """Only the same scope is the same group: k's work may call k of another directory
    or namespace, which runs it; and a directory named through a symlink is the same."""
    first, _ = pair
    stranger = _stranger(first, str(tmp_path))
    try:
        def outer() -> str:
            return "outer+" + stranger.run_sync("k", lambda: "elsewhere").value

        assert first.run_sync("k", outer).value == "outer+elsewhere"
    finally:
        stranger.close()
    if scope_of(first).kind == "fleet":
        return
    link = os.path.join(str(tmp_path), "link")
    os.symlink(table_of(first).scope[1], link)
    alias = FlightGroup(directory=link, codec=JSON)
    try:
        def through_alias() -> str:
            with pytest.raises(RuntimeError, match="wait for itself"):
                alias.run_sync("k", lambda: "inner")
            return "outer"

        assert first.run_sync("k", through_alias, fresh=True).value == "outer"
    finally:
        alias.close()


@pytest.mark.parametrize(
    ("spelling", "same"),
    [
        ("redis://localhost:{port}", True),
        ("redis://LOCALHOST:{port}/0?socket_timeout=7", True),
        ("redis://[::1]:{port}/0", True),
        ("redis://127.0.0.1:{port}/1", False),  # another database: another scope
    ],
)
def test_two_spellings_of_one_redis_are_one_scope(
    redis_server: Any, namespace: str, spelling: str, same: bool
) -> None:
    """A group on ``redis://127.0.0.1:P/0`` and one on ``redis://localhost:P`` share
    every flight in Redis, so they are one group to I6: a work of k that calls k through
    the other raises instead of joining its own flight and waiting for itself until the
    deadline (the scope is the server, not the URL as written). Another database is another
    scope, where the call runs."""
    first = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    second = FlightGroup(
        redis=spelling.format(port=redis_server.port), namespace=namespace, codec=JSON
    )
    try:
        def outer() -> str:
            if same:
                with pytest.raises(RuntimeError, match="wait for itself"):
                    second.run_sync("k", lambda: "inner")
                return "outer"
            return "outer+" + second.run_sync("k", lambda: "inner").value

        want = "outer" if same else "outer+inner"
        assert first.run_sync("k", outer, timeout=20).value == want
    finally:
        second.close()
        first.close()


def test_a_task_that_outlives_its_flights_work_calls_the_key_as_anyone(
    pair: tuple[Any, Any],
) -> None:
    """The check is of a flight whose work still runs: a task the work started, which
    calls the key through the other group after the flight ended, leads or joins it as
    any caller would (it inherited the work's context, and so its chain)."""
    first, second = pair
    ended = threading.Event()

    async def main() -> str:
        later: list[asyncio.Task[Any]] = []

        async def work() -> str:
            async def afterwards() -> Any:
                assert await asyncio.to_thread(ended.wait, 20)
                return await second.run("k", _value("again"), fresh=True)

            later.append(asyncio.create_task(afterwards()))
            return "first"

        assert (await first.run("k", work)).value == "first"
        ended.set()
        return (await later[0]).value  # type: ignore[no-any-return]

    assert asyncio.run(main()) == "again"


def _value(value: str) -> Any:
    async def work() -> str:
        return value

    return work


def test_run_sync_through_another_group_on_the_loop_that_runs_the_flight_is_refused(
    pair: tuple[Any, Any],
) -> None:
    """run_sync on the thread of the loop that runs a flight's async work blocks that
    work: refused in its own group, and through another group of the same scope too,
    which would have joined the flight (or, fresh, waited for its end) for ever."""
    first, second = pair

    async def main() -> str:
        release = asyncio.Event()

        async def work() -> str:
            await release.wait()
            return "v"

        leader = asyncio.create_task(first.run("k", work))
        for _ in range(1000):
            flight = flight_of(first, "k")
            if flight is not None and flight.loop is not None and flight.decided:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the flight never started")
        for fresh in (False, True):
            with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="block"):
                second.run_sync("k", lambda: "other", fresh=fresh)
        # another key of the same loop's thread is not this flight's: it runs (it blocks
        # the loop meanwhile: a warning)
        with pytest.warns(RuntimeWarning, match="blocks that loop"):
            assert second.run_sync("j", lambda: "j").value == "j"
        release.set()
        return (await leader).value  # type: ignore[no-any-return]

    assert asyncio.run(main()) == "v"


def test_the_scopes_register_forgets_the_scopes_of_collected_groups(tmp_path: Any) -> None:
    """A program that makes groups on many directories over its life (a temporary one per
    job) keeps no entry per directory once its groups are gone."""
    import gc

    from flightgroup.scope import kin

    for i in range(300):
        g = FlightGroup(directory=os.path.join(str(tmp_path), f"d{i}"), codec=JSON)
        del g
        if i % 25 == 0:  # (a full collection each time took 30 s in a big test process)
            gc.collect()
    # swept whenever the register doubled: bounded, not one entry per directory (a
    # scope's identity is any hashable: a fake scope's, say, holds no path)
    assert len([scope for scope in kin._KIN if str(tmp_path) in repr(scope)]) < 130


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_fork_while_another_thread_holds_the_scopes_register_lock(tmp_path: Any) -> None:
    """A fork while another thread of the parent holds the register's lock (it makes a
    wide group, or a nested call reads the register): the child makes groups too. Its
    copy of the lock is free."""
    import multiprocessing

    from flightgroup.scope import kin

    with kin._KIN_LOCK:  # as another thread would hold it at the fork
        child = multiprocessing.get_context("fork").Process(
            target=_make_a_group, args=(os.path.join(str(tmp_path), "child"),)
        )
        child.start()
    child.join(20)
    alive = child.is_alive()
    if alive:
        child.kill()
        child.join()
    assert not alive and child.exitcode == 0, "the child hung on the register's lock"


def _make_a_group(path: str) -> None:
    FlightGroup(directory=path, codec=JSON).close()


def test_a_flight_being_forgotten_is_still_seen_by_another_group_of_its_scope(
    directory: str,
) -> None:
    """The cross-group check reads the other group's table without its lock, so a flight
    leaving the table (forget) must be in ``detached`` before it leaves ``flights``: in
    no step between where a nested call through the other group sees it in neither and
    joins it in the scope to wait for itself. The forgetting thread is traced and held at
    any line where the flight is in neither."""
    import sys

    first = FlightGroup(directory=directory, codec=JSON)
    second = FlightGroup(directory=directory, codec=JSON)
    table = table_of(first)
    started, go, checked = threading.Event(), threading.Event(), threading.Event()
    inner: list[BaseException | str] = []

    def work() -> str:
        started.set()
        assert go.wait(20)
        try:
            inner.append(second.run_sync("k", lambda: "inner", timeout=5).value)
        except BaseException as exc:
            inner.append(exc)
        checked.set()
        return "outer"

    def in_neither() -> bool:
        return not any(f.tkey == "k" for f in (*table.flights.values(), *table.detached))

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and not go.is_set() and in_neither():
            go.set()  # the window: the nested call runs now
            assert checked.wait(20)
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is type(table).forget.__code__ else None

    def forget() -> None:
        sys.settrace(tracer)
        try:
            first.forget("k")
        finally:
            sys.settrace(None)

    try:
        outer = Background(lambda: first.run_sync("k", work))
        assert started.wait(20)
        Background(forget).wait()
        go.set()
        assert outer.wait().value == "outer"
        [error] = inner
        assert isinstance(error, RuntimeError) and "wait for itself" in str(error), error
    finally:
        go.set()
        first.close()
        second.close()


_FORK_AFTER_A_WIDE_GROUP = """
import multiprocessing, sys, tempfile
from flightgroup import JSON, FlightGroup

g = FlightGroup(directory=tempfile.mkdtemp(dir="/tmp") + "/d", codec=JSON)
g.run_sync("k", lambda: 1)  # started: the child's at-fork handlers tell its scope
g.close()
from flightgroup.scope import kin

def child(path):
    FlightGroup(directory=path, codec=JSON).close()

with kin._KIN_LOCK:  # as another thread would hold it at the fork
    p = multiprocessing.get_context("fork").Process(
        target=child, args=(tempfile.mkdtemp(dir="/tmp") + "/c",)
    )
    p.start()
p.join(10)
if p.is_alive():
    p.kill()
    sys.exit("the child hung on the register's lock")
sys.exit(p.exitcode)
"""


def test_a_fork_after_a_wide_groups_first_use_renews_the_register_lock_first() -> None:
    """In a fresh process whose first wide group made the scope's modules load before
    scope.table (configure opens the scope, then the group makes its table), the
    scope's at-fork handler was registered first: in the child it made the started
    group's new table, which took the register's copied, held lock before it was
    renewed, and the child hung. Found by the contract suite over every scope: any
    earlier test of the worker that used a wide group first made the test above hang."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FORK_AFTER_A_WIDE_GROUP],
        capture_output=True, text=True, timeout=40,
    )
    assert done.returncode == 0, done.stderr[-2000:]
