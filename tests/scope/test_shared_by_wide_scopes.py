"""What the wide scopes share (flightgroup.scope): the kept failures' causes, kept across
the groups of one scope in a process; the bridge's sync leading caller, which withdraws
alone; the background loop, which starts a posted task in the turn it comes and leaves no
task pending when it stops; and a wide group's
end (closed or dropped), which lets go of its threads, connections and remembered errors."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flightgroup import FlightFailedError, FlightGroup, Retention
from flightgroup.scope.bridge import Bridge
from flightgroup.scope.causes import KeptCauses

from ..infleet import never
from ..infresh import held
from ..ingroup import Background, close, group
from ..support import bridge_of, scope_of, wait_until


def test_kept_causes_are_found_by_key_and_token_and_bounded() -> None:
    causes = KeptCauses(limit=3)
    errors = [ValueError(i) for i in range(4)]
    for i, error in enumerate(errors):
        causes.remember("k", i, error, 60.0)
    assert causes.cause("k", 0) is None  # the oldest went past the bound
    assert [causes.cause("k", i) for i in (1, 2, 3)] == errors[1:]
    assert causes.cause("k", 4) is None and causes.cause("other", 3) is None
    causes.remember("k", 1, errors[0], 60.0)  # remembered again: the newest
    causes.remember("j", 9, errors[3], 60.0)
    assert causes.cause("k", 2) is None and causes.cause("k", 1) is errors[0]


def test_kept_causes_drop_an_error_whose_keep_time_ran_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("flightgroup.scope.causes.time.monotonic", lambda: now[0])
    causes = KeptCauses()
    error = KeyError("gone")
    causes.remember("k", 1, error, 5.0)
    now[0] += 4.9
    assert causes.cause("k", 1) is error
    now[0] += 0.1
    assert causes.cause("k", 1) is None  # as the kept failure it explains


def test_kept_causes_drop_every_expired_error_not_only_the_oldest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One error kept long (a kept failure's keep time) must not hold the short ones
    remembered after it: each goes when its own time ends."""
    import gc
    import weakref

    class Held(Exception):
        pass  # (a KeyError takes no weak reference)

    now = [1000.0]
    monkeypatch.setattr("flightgroup.scope.causes.time.monotonic", lambda: now[0])
    causes = KeptCauses()
    causes.remember("long", 1, Held("long"), 100.0)
    short = [Held(f"short{i}") for i in range(3)]
    refs = [weakref.ref(error) for error in short]
    for i, error in enumerate(short):
        causes.remember("short", i + 2, error, 1.0)
    del short, error
    now[0] += 2.0
    assert causes.cause("short", 2) is None  # expired: dropped, with the others
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]
    assert causes.cause("long", 1) is not None


def test_failures_landed_at_once_by_two_leaders_both_keep_their_cause(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's memory of errors is made once, at its first failure: two leaders landing
    their first failures at once share it, and neither's errors are lost. Here both would
    reach the making at once if nothing stopped them."""
    import contextlib
    import threading

    import flightgroup.scope.landing as landing_module

    meet = threading.Barrier(2)

    class Meeting(landing_module.KeptCauses):
        def __init__(self) -> None:
            # the making is guarded: the other thread waits for this one, and this
            # wait gives up
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.wait(1.0)
            super().__init__()

    monkeypatch.setattr(landing_module, "KeptCauses", Meeting)
    a, b = (group(directory, retention=Retention(success=None, error=60.0)) for _ in "ab")
    try:
        errors = {key: KeyError(key) for key in ("k1", "k2")}
        both = threading.Barrier(2)

        def lead(key: str) -> None:
            def boom() -> None:
                both.wait(10)  # both works end together
                raise errors[key]

            with pytest.raises(KeyError):
                a.run_sync(key, boom)

        threads = [threading.Thread(target=lead, args=(key,)) for key in errors]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        for key, error in errors.items():
            with pytest.raises(FlightFailedError) as kept:
                b.run_sync(key, lambda: "never")
            assert kept.value.__cause__ is error, key
    finally:
        close(a, b)


def test_a_kept_failure_led_in_another_group_of_the_process_has_its_cause(
    directory: str,
) -> None:
    # docs/api.md: a kept failure raises FlightFailedError "with __cause__ in the leader's
    # process": two groups of one process on one directory are one group (ADR 0023).
    a, b = (group(directory, retention=Retention(success=None, error=60.0)) for _ in "ab")
    try:
        original = KeyError("missing")

        def boom() -> None:
            raise original

        with pytest.raises(KeyError):
            a.run_sync("k", boom)
        with pytest.raises(FlightFailedError) as other:
            b.run_sync("k", lambda: "never")
        with pytest.raises(FlightFailedError) as own:
            a.run_sync("k", lambda: "never")
        assert other.value.error_type == own.value.error_type == "KeyError"
        assert other.value.__cause__ is original
        assert own.value.__cause__ is original
    finally:
        close(a, b)


def test_a_sync_leading_callers_on_join_raising_a_base_exception_withdraws_only_itself(
    pair: tuple[FlightGroup, FlightGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    """b's first caller leads b's flight of "k" (sync, no timeout: it drives the flight
    in its own thread); a second caller of b joins it locally; the scope then says the
    flight joins a's. The first caller's on_join raises KeyboardInterrupt (a signal that
    came during it): that caller withdraws alone, the second gets a's value."""
    a, b = pair
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()
    leader = Background(lambda: a.run_sync("k", held(runs, "a", started, release)))
    assert started.wait(10)
    second_joined = threading.Event()
    original = Bridge._joined

    def joined_remote(of: Bridge, *args: Any) -> Any:
        if of is bridge_of(b):  # JOINED is held until the second caller joined b's flight
            assert second_joined.wait(10)
        return original(of, *args)

    monkeypatch.setattr(Bridge, "_joined", joined_remote)

    def interrupted() -> None:
        raise KeyboardInterrupt

    first = Background(lambda: b.run_sync("k", never, on_join=interrupted))
    wait_until(lambda: b.stats().in_flight == 1, "the first caller leads b's flight")
    told: list[None] = []
    second = Background(lambda: b.run_sync("k", never, on_join=lambda: told.append(None)))
    wait_until(lambda: b.stats().joins == 1, "the second caller joined b's flight")
    second_joined.set()
    assert first.done.wait(10)
    assert isinstance(first.error, KeyboardInterrupt)
    release.set()
    assert leader.wait().value == "a"
    got = second.wait()  # not FlightInterruptedError: "its leading caller got ..."
    assert (got.value, got.joined, got.token) == ("a", True, leader.wait().token)
    assert runs == ["a"] and told == [None]  # its on_join ran once b's flight joined a's


def test_a_stopped_group_loop_cancels_the_tasks_its_tasks_start_as_they_end() -> None:
    """A task that starts another as it is cancelled (a connection's cleanup): the
    loop cancels that one too before it closes, not only the tasks there when the loop
    stopped: none is destroyed pending (asyncio would log "Task was destroyed but it is
    pending!")."""
    import asyncio

    from flightgroup.scope.loop import start_loop

    ended: list[str] = []
    running = threading.Event()

    async def second() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("second")

    async def first() -> None:
        try:
            running.set()
            await asyncio.Event().wait()
        finally:
            asyncio.get_running_loop().create_task(second())
            ended.append("first")

    loop, thread = start_loop("test-loop", lambda loop: None)
    loop.call_soon_threadsafe(lambda: loop.create_task(first()))
    assert running.wait(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    assert not thread.is_alive() and loop.is_closed()
    assert ended == ["first", "second"]


def test_a_task_posted_to_a_group_loop_takes_its_first_step_in_the_turn_it_comes() -> None:
    """A landing or an ACQUIRE posted to the group's loop sends its request at once
    (``post_task``): its first step runs in the loop turn its post arrives, ahead of what
    was posted after it, not one turn later; the task is then held until it ends."""
    import asyncio

    from flightgroup.scope.loop import BackgroundLoop

    class Owner:
        def forked(self, why: str, inherited: BackgroundLoop) -> None: ...

    owner = Owner()
    background = BackgroundLoop("test", owner.forked)
    background.ensure_started(lambda loop: None, check=lambda: None)
    order: list[str] = []
    hold, held_now, go = threading.Event(), threading.Event(), asyncio.Event()

    async def request() -> None:
        order.append("first step")
        await go.wait()
        order.append("ended")

    def block() -> None:  # the loop runs nothing else until the three are all queued
        held_now.set()
        hold.wait(10)

    try:
        assert background.post(block)
        assert held_now.wait(10)
        assert background.post_task(request())
        assert background.post(order.append, "posted after it")
        hold.set()
        wait_until(lambda: len(order) == 2, "the loop ran what was posted")
        assert order == ["first step", "posted after it"]
        [task] = background.tasks  # held while it waits
        assert background.post(go.set)
        wait_until(task.done, "the task ended")
        assert order[-1] == "ended"
        wait_until(lambda: not background.tasks, "the ended task was let go")
    finally:
        hold.set()
        background.stop()


def test_a_closing_directory_group_leaves_no_task_pending_on_its_loop(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No task of the group is left pending on its loop when close() stops it: the
    connection's keeper never waits on a channel that closing shut without a word, to be
    collected and destroyed pending ("Task was destroyed but it is pending!"). The test
    looks at the loop's tasks at the moment close() stops it."""
    import asyncio
    import concurrent.futures
    import gc

    from flightgroup import JSON
    from flightgroup.scope.loop import BackgroundLoop

    post = BackgroundLoop.post
    seen: list[list[str]] = []

    def probing(self: BackgroundLoop, fn: Any, *args: Any) -> bool:
        if getattr(fn, "__name__", "") == "stop":
            done: concurrent.futures.Future[list[str]] = concurrent.futures.Future()

            def probe() -> None:
                tasks = asyncio.all_tasks(self.loop)
                done.set_result([t.get_coro().__qualname__ for t in tasks])
                del tasks
                gc.collect()

            post(self, probe)
            seen.append(done.result(10))
        return post(self, fn, *args)

    monkeypatch.setattr(BackgroundLoop, "post", probing)
    g = FlightGroup(directory=directory, codec=JSON)
    assert g.run_sync("k", lambda: 1).value == 1
    g.close()
    assert seen == [[]]


@pytest.mark.parametrize("scope", ["directory", "fleet"])
def test_a_wide_group_dropped_without_close_lets_go_of_its_threads_and_connections(
    request: pytest.FixtureRequest, scope: str
) -> None:
    """A wide group collected without close() warns (ResourceWarning, as an unclosed
    socket does) and closes its scope's machinery: its background threads, its sockets
    and (fleet) its Redis connections do not live on with the process."""
    import gc
    import warnings

    from ..ingroup import scope_groups

    [g] = scope_groups(request, scope, 1, lease=5.0)
    assert g.run_sync("k", lambda: 1).value == 1
    arbiter = scope_of(g)
    thread = arbiter._background.thread  # type: ignore[union-attr]
    assert thread is not None and thread.is_alive()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del g
        # The scope's thread holds the group until it has handled the call's last answer
        # (the landing's acknowledgement): the group is collected at a collection after that.
        wait_until(
            lambda: gc.collect() >= 0 and bool(caught), "the dropped group is collected"
        )
    assert [w.category for w in caught] == [ResourceWarning], caught
    assert "unclosed FlightGroup(" in str(caught[0].message)
    thread.join(20)
    assert not thread.is_alive()
    if scope == "directory":
        assert arbiter._state.channel is None  # type: ignore[union-attr]
    # A closed group's collection says nothing; nor does an unused one's (construction
    # does no I/O: nothing to let go of), nor a group the fork hook closed in a child.
    closed, unused, forked = scope_groups(request, scope, 3, lease=5.0)
    closed.close()
    assert forked.run_sync("k", lambda: 1).value == 1
    scope_of(forked).on_fork("this is a forked child")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del closed, unused, forked
        gc.collect()
    assert not [w for w in caught if w.category is ResourceWarning], caught


def test_a_closed_group_lets_go_of_the_errors_it_remembered_for_cause(
    request: pytest.FixtureRequest,
) -> None:
    """Errors remembered for __cause__ (another group of the scope is open) hold their
    works' frames: a closed group that is still referenced lets them go."""
    import gc
    import weakref

    from ..ingroup import scope_groups

    a, b = scope_groups(request, "directory", 2, lease=5.0)

    class Big:
        pass

    seen: list[weakref.ref[Big]] = []

    def fails() -> None:
        local = Big()  # a local of the failed work's frame
        seen.append(weakref.ref(local))
        raise ValueError("boom")

    with pytest.raises(ValueError):
        a.run_sync("k", fails)
    gc.collect()
    assert seen[0]() is not None  # remembered (b is kin): its frame is held
    a.close()
    gc.collect()
    assert seen[0]() is None
    b.close()
