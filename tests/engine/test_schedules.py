"""Random schedules of calls, cancels, failures and forgets against a process group.

A schedule is a list of steps over two or three keys: call (async, or ``run_sync`` in
a thread; plain or ``fresh``; a work that waits for its release or one that ends at
once), cancel a waiting async caller, release a running work with a value or with an
error, forget a key. It runs in one event loop and never sleeps for time to pass:

- every work that does not end at once waits on an event of its own that only a
  "release" step sets, so the schedule decides when each flight ends;
- ``await asyncio.sleep(0)`` only lets tasks that are already ready run (a step drains
  0, 1, 2 or 16 times; fewer than 16 leaves wake-ups in transit for the next step);
- a sync caller runs in a thread, and the schedule waits (bounded) until that thread
  has arrived (its work started, its ``on_join`` ran, or it queued as a fresh caller)
  before it takes its next step; when a run ends, the schedule waits the same way for
  the fresh sync callers that waited for it.

A small model follows the schedule: for each key, the run that is in the table now (it
started after the key's last forget and has not ended). From it every caller's flight
follows:

- a call that finds no run leads: its own work runs and it gets that outcome;
- a plain call that finds run R joins R;
- a fresh call that finds run R gets the next flight: the run in the table when R
  ended, or else the key's first run to start after R ended (the flight R's end left
  for its fresh callers); that run started after the call, and all fresh calls that
  found R share it.

Checked after every schedule: at most one run per key and forget generation at a time,
each caller's work ran at most once, every caller's outcome (the very value object, the
leader's own exception, a joiner's FlightFailedError with ``__cause__``, CancelledError
for a cancelled caller and for nobody else), ``joined``, ``token``, ``on_join``, an
empty table, and the stats counters.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import flightgroup
from flightgroup import FlightFailedError, Result

from ..support import flights_of

KEYS = ("a", "b", "c")
FULL = 16  # sleep(0)s that let every chain of wake-ups run out (a chain is < 6 long)
WAIT = 2.0  # bound of each wait for a thread or task that should be done in microseconds
EXAMPLE_TIMEOUT = 30.0  # bound of one whole schedule (seconds)


class Boom(Exception):
    """What a work released with ``fail=True`` raises."""


@dataclass(eq=False)
class Value:
    """What a work released with a value returns: one object per run."""

    run: int


# -- the steps of a schedule --------------------------------------------------------


@dataclass(frozen=True)
class Call:
    key: int
    fresh: bool = False
    thread: bool = False  # run_sync in a thread (only in the mixed test)
    instant: str | None = None  # "value" / "raise": the work ends at once (async only)
    drain: int = FULL


@dataclass(frozen=True)
class Cancel:
    pick: int  # among the async callers whose task is not done
    drain: int = FULL


@dataclass(frozen=True)
class Release:
    pick: int  # among the runs that wait for their release
    fail: bool = False
    drain: int = FULL


@dataclass(frozen=True)
class Forget:
    key: int


Step = Call | Cancel | Release | Forget


def schedules(threads: bool) -> st.SearchStrategy[list[Step]]:
    drain = st.sampled_from([0, 1, 2, FULL])
    key = st.sampled_from([0, 0, 0, 1, 1, 2])  # a busy key, a quieter one, a rare one
    call = st.builds(
        Call,
        key=key,
        fresh=st.booleans(),
        thread=st.booleans() if threads else st.just(False),
        instant=st.sampled_from([None, None, None, "value", "raise"]),
        drain=drain,
    )
    cancel = st.builds(Cancel, pick=st.integers(0, 7), drain=drain)
    release = st.builds(Release, pick=st.integers(0, 7), fail=st.booleans(), drain=drain)
    forget = st.builds(Forget, key=key)
    kinds: dict[str, st.SearchStrategy[Step]] = {
        "call": call,
        "release": release,
        "cancel": cancel,
        "forget": forget,
    }
    weights = ["call"] * 5 + ["release"] * 3 + ["cancel", "forget"]
    step = st.sampled_from(weights).flatmap(kinds.__getitem__)
    return st.lists(step, min_size=8, max_size=40)


# -- what happened --------------------------------------------------------------------

_PENDING: Any = object()


@dataclass(eq=False)
class Caller:
    id: int
    key: str
    fresh: bool
    thread: bool
    instant: str | None
    step: int | None = None  # the step counter when it called; None: it never did
    current: Run | None = None  # the model's run of its key when it called
    task: asyncio.Task[None] | None = None
    thread_obj: threading.Thread | None = None
    cancelled: bool = False  # task.cancel() returned True
    outcome: Any = _PENDING  # a Result or the exception the call raised
    on_join_calls: int = 0
    work_calls: int = 0
    run: Run | None = None  # the run of its own work
    # set when a thread caller has arrived: its work started, on_join ran, or it returned
    settled: threading.Event = field(default_factory=threading.Event)
    waits_on: Run | None = None  # a fresh thread caller queued for the end of this run


@dataclass(eq=False)
class Run:
    id: int
    key: str
    leader: Caller
    epoch: int  # forgets of the key before the work started
    start: int
    token: int
    event: asyncio.Event | threading.Event
    fail: bool = False
    released: bool = False
    end: int | None = None
    value: Value | None = None
    error: Boom | None = None


class World:
    """One schedule: the group, the callers, the runs and the model."""

    def __init__(self, n_keys: int, short_drains: bool) -> None:
        self.g = flightgroup.FlightGroup()
        self.keys = KEYS[:n_keys]
        self.short_drains = short_drains
        self.lock = threading.Lock()
        self.steps = itertools.count(1)
        self.forgets = dict.fromkeys(self.keys, 0)
        self.callers: list[Caller] = []
        self.runs: list[Run] = []
        self.running: Counter[tuple[str, int]] = Counter()
        self.violations: list[str] = []
        self.forget_log: list[tuple[int, str]] = []  # (step, key)
        self.seen: set[str] = set()  # coverage notes, reported as hypothesis events

    # -- bookkeeping, from the callers and the works ---------------------------------

    def arrive(self, c: Caller) -> None:
        """Right before the call: its step, and the run the model says is current."""
        with self.lock:
            c.step = next(self.steps)
            current = [
                r
                for r in self.runs
                if r.key == c.key and r.end is None and r.epoch == self.forgets[c.key]
            ]
            if len(current) > 1:
                self.violations.append(f"caller {c.id} found runs {[r.id for r in current]}")
            c.current = current[0] if current else None

    def start(self, c: Caller, event: asyncio.Event | threading.Event) -> Run:
        token = flightgroup.current_lease().token
        with self.lock:
            c.work_calls += 1
            epoch = self.forgets[c.key]
            run = Run(len(self.runs), c.key, c, epoch, next(self.steps), token, event)
            run.fail = c.instant == "raise"
            c.run = run
            self.runs.append(run)
            self.running[c.key, epoch] += 1
            if sum(n for (k, _), n in self.running.items() if k == c.key) > 1:
                self.seen.add("a run started beside a forgotten one")
            if self.running[c.key, epoch] > 1:
                self.violations.append(
                    f"run {run.id} of {c.key!r} started beside another one of its generation"
                )
        c.settled.set()
        return run

    def end(self, run: Run) -> Value:
        with self.lock:
            run.end = next(self.steps)
        if run.fail:
            run.error = Boom(f"run {run.id} failed")
            raise run.error
        run.value = Value(run.id)
        return run.value

    def leave(self, run: Run) -> None:
        with self.lock:
            self.running[run.key, run.epoch] -= 1

    def on_join(self, c: Caller) -> None:
        c.on_join_calls += 1
        c.settled.set()

    # -- the callers --------------------------------------------------------------------

    async def async_call(self, c: Caller) -> None:
        async def work() -> Value:
            run = self.start(c, asyncio.Event())
            try:
                if c.instant is None:
                    await run.event.wait()  # type: ignore[misc]
                return self.end(run)
            finally:
                self.leave(run)

        self.arrive(c)  # no await between this and the group's own arrival
        try:
            c.outcome = await self.g.run(
                c.key, work, on_join=lambda: self.on_join(c), fresh=c.fresh
            )
        except BaseException as exc:  # CancelledError included: the outcome to check
            c.outcome = exc

    def sync_call(self, c: Caller) -> None:
        def work() -> Value:
            run = self.start(c, threading.Event())
            try:
                if not run.event.wait(EXAMPLE_TIMEOUT):  # type: ignore[call-arg]
                    raise RuntimeError(f"run {run.id} was never released")
                return self.end(run)
            finally:
                self.leave(run)

        try:
            self.arrive(c)
            c.outcome = self.g.run_sync(c.key, work, on_join=lambda: self.on_join(c), fresh=c.fresh)
        except BaseException as exc:
            c.outcome = exc
        finally:
            c.settled.set()

    # -- the schedule's side ----------------------------------------------------------------

    async def drain(self, n: int) -> None:
        for _ in range(n if self.short_drains else FULL):
            await asyncio.sleep(0)

    def fresh_queued(self) -> int:
        """Fresh callers queued for the end of a flight: the only way to see that a fresh
        thread caller has arrived."""
        return sum(len(f.fresh or ()) for f in flights_of(self.g))

    def settle_threads(self) -> None:
        """Wait for the fresh thread callers whose awaited run ended to take their claim."""
        for c in self.callers:
            run = c.waits_on
            if run is not None and run.end is not None:
                assert c.settled.wait(WAIT), f"thread caller {c.id} never took its claim"
                c.waits_on = None

    async def call(self, step: Call) -> None:
        thread = step.thread
        c = Caller(
            len(self.callers),
            self.keys[step.key % len(self.keys)],
            step.fresh,
            thread,
            None if thread else step.instant,
        )
        self.callers.append(c)
        if not thread:
            c.task = asyncio.create_task(self.async_call(c))
            await self.drain(step.drain)
            return
        before = self.fresh_queued()
        c.thread_obj = threading.Thread(target=self.sync_call, args=(c,), daemon=True)
        c.thread_obj.start()
        deadline = time.monotonic() + WAIT
        while not c.settled.wait(0.001 if c.fresh else WAIT):
            if c.fresh and self.fresh_queued() > before:
                if c.current is None:
                    self.violations.append(f"fresh caller {c.id} queued, but no run was current")
                c.waits_on = c.current
                break
            assert time.monotonic() < deadline, f"thread caller {c.id} never arrived"
        await self.drain(FULL)

    async def cancel(self, step: Cancel) -> None:
        live = [c for c in self.callers if c.task is not None and not c.task.done()]
        if live:
            c = live[step.pick % len(live)]
            assert c.task is not None
            c.cancelled |= c.task.cancel()
            if c.step is not None and c.current is not None and c.current.end is not None:
                self.seen.add("cancelled after its flight ended (a wake-up in transit)")
            await self.drain(step.drain)

    async def release(self, run: Run, fail: bool, drain: int) -> None:
        run.released = True
        run.fail = fail
        run.event.set()
        if isinstance(run.event, threading.Event):
            th = run.leader.thread_obj
            assert th is not None
            th.join(WAIT)
            assert not th.is_alive(), f"the leader thread of run {run.id} did not return"
        await self.drain(drain)

    def current_at(self, key: str, step: int) -> Run | None:
        """The run of ``key`` in the table at ``step``: started before, not ended, and
        not forgotten since it started."""
        found = [
            r
            for r in self.runs
            if r.key == key
            and r.start < step
            and (r.end is None or r.end > step)
            and not any(k == key and r.start < s < step for s, k in self.forget_log)
        ]
        assert len(found) <= 1, found
        return found[0] if found else None

    def waiting_runs(self) -> list[Run]:
        return [r for r in self.runs if not r.released and r.end is None]

    async def forget(self, step: Forget) -> None:
        await self.drain(FULL)  # no claim in transit: see the epoch rule in check()
        self.settle_threads()
        key = self.keys[step.key % len(self.keys)]
        with self.lock:
            self.g.forget(key)
            self.forgets[key] += 1
            self.forget_log.append((next(self.steps), key))

    async def play(self, schedule: list[Step]) -> None:
        try:
            for step in schedule:
                self.settle_threads()
                if isinstance(step, Call):
                    await self.call(step)
                elif isinstance(step, Cancel):
                    await self.cancel(step)
                elif isinstance(step, Release):
                    waiting = self.waiting_runs()
                    if waiting:
                        run = waiting[step.pick % len(waiting)]
                        await self.release(run, step.fail, step.drain)
                else:
                    await self.forget(step)
            # Land everything: release what waits (fresh callers may start more runs).
            for _ in range(len(self.callers) + 2):
                await self.drain(FULL)
                self.settle_threads()
                waiting = self.waiting_runs()
                if not waiting:
                    break
                await self.release(waiting[0], False, FULL)
            assert not self.waiting_runs(), "runs kept starting"
            tasks = [c.task for c in self.callers if c.task is not None and not c.task.done()]
            if tasks:
                _, not_done = await asyncio.wait(tasks, timeout=WAIT)
                assert not not_done, f"{len(not_done)} async callers never returned"
            for c in self.callers:
                if c.thread_obj is not None:
                    c.thread_obj.join(WAIT)
                    assert not c.thread_obj.is_alive(), f"thread caller {c.id} never returned"
        finally:
            for run in self.runs:  # never leave a thread waiting on an event
                run.event.set()


def play(schedule: list[Step], n_keys: int, threads: bool) -> World:
    # Short drains leave wake-ups in transit across steps. The model needs a leader's
    # arrival and its work's start to be one step (the eager start), and threads that
    # do not race the loop, so short drains are only for async-only schedules.
    world = World(n_keys, short_drains=not threads)

    async def bounded() -> None:
        await asyncio.wait_for(world.play(schedule), EXAMPLE_TIMEOUT)

    asyncio.run(bounded())
    return world


# -- the checks -----------------------------------------------------------------------


def check(world: World) -> None:
    assert not world.violations, world.violations
    runs, callers = world.runs, world.callers
    by_value = {id(r.value): r for r in runs if r.value is not None}
    by_error = {id(r.error): r for r in runs if r.error is not None}

    # Every run ended; at most one at a time per key and forget generation (checked as
    # they started); tokens are distinct and grow with each key's runs when it was
    # never forgotten. (A forget detaches a flight and lets a new one start beside it;
    # the schedule forgets only when no fresh claim is in transit, so a run's
    # generation is the key's forget count when its work started.)
    assert all(r.end is not None for r in runs)
    assert all(n == 0 for n in world.running.values())
    assert len({r.token for r in runs}) == len(runs), [r.token for r in runs]
    for key in world.keys:
        if world.forgets[key] == 0:
            tokens = [r.token for r in runs if r.key == key]
            assert tokens == sorted(tokens), (key, tokens)

    entered = cancelled_entered = joiners = 0
    failed_instances: set[int] = set()
    fresh_groups: dict[int, set[int]] = {}  # run found -> fresh callers
    fresh_runs: dict[int, set[int]] = {}  # run found -> runs those callers got
    for c in callers:
        assert c.work_calls <= 1, f"the work of caller {c.id} ran {c.work_calls} times"
        if c.step is None:  # cancelled before it could call
            assert c.cancelled, c
            assert c.task is not None
            assert c.task.cancelled()
            continue
        entered += 1
        o = c.outcome
        assert o is not _PENDING, f"caller {c.id} got no outcome"
        if c.cancelled:
            cancelled_entered += 1
            world.seen.add("cancelled leader" if c.run else "cancelled non-leader")
            assert isinstance(o, asyncio.CancelledError), (c.id, o)
            continue
        assert not isinstance(o, asyncio.CancelledError), f"caller {c.id} was not cancelled"
        if isinstance(o, Result):
            run = by_value.get(id(o.value))
            assert run is not None, (c.id, o)
            assert o.value is run.value
            assert o.token == run.token, (c.id, o.token, run.token)
            assert o.joined == (run.leader is not c), (c.id, o, run.id, run.leader.id)
        elif isinstance(o, Boom):
            run = by_error.get(id(o))
            assert run is not None, (c.id, o)
            assert run.leader is c, f"caller {c.id} got the error of run {run.id} itself"
        elif isinstance(o, FlightFailedError):
            run = by_error.get(id(o.__cause__))
            assert run is not None, (c.id, o, o.__cause__)
            assert run.leader is not c, f"leader {c.id} got FlightFailedError"
            assert (o.key, o.error_type, o.message) == (c.key, "Boom", str(run.error))
            assert o.error_module == Boom.__module__
            assert id(o) not in failed_instances, "two joiners share a FlightFailedError"
            failed_instances.add(id(o))
            world.seen.add("joiner got FlightFailedError")
        else:
            raise AssertionError(f"caller {c.id} got {o!r}")
        assert run.key == c.key
        leader = run.leader is c
        if c.run is not None:
            assert leader, f"caller {c.id} ran run {c.run.id} but got run {run.id}"
        joiners += not leader
        assert c.on_join_calls == (0 if leader else 1), (c.id, c.on_join_calls, leader)
        if c.current is None:
            assert leader, f"caller {c.id} found no run, so it leads; it got run {run.id}"
        elif not c.fresh:
            assert run is c.current, f"caller {c.id} must join run {c.current.id}, not {run.id}"
        else:
            # The next flight: the one in the table when the run it found ended, or else
            # the one that ending left for its fresh callers to lead (the key's first run
            # to start after that end).
            assert c.step is not None
            assert run.start > c.step, f"fresh caller {c.id} got run {run.id}, older than it"
            ended = c.current.end
            assert ended is not None
            following = world.current_at(c.key, ended)
            if following is None:
                following = min(
                    (r for r in runs if r.key == c.key and r.start > ended),
                    key=lambda r: r.start,
                    default=None,
                )
            assert following is not None, f"no run followed run {c.current.id}"
            assert run is following, f"fresh caller {c.id} got run {run.id}, not {following.id}"
            fresh_groups.setdefault(c.current.id, set()).add(c.id)
            fresh_runs.setdefault(c.current.id, set()).add(run.id)
            world.seen.add("fresh thread caller queued" if c.thread else "fresh caller queued")
    for found, got in fresh_runs.items():
        assert len(got) == 1, f"the fresh callers that found run {found} got runs {got}"
        if len(fresh_groups[found]) > 1:
            world.seen.add("fresh callers shared a flight")

    # The table is empty and the counters add up.
    left = flights_of(world.g)
    assert left == [], left
    s = world.g.stats()
    assert s.in_flight == 0
    assert s.calls == entered
    assert s.flights == len(runs)
    assert s.failures == sum(r.error is not None for r in runs)
    assert s.interrupted == 0
    assert s.kept == 0
    # Each call leads or joins once at most, and exactly once unless it was cancelled
    # (a fresh caller cancelled while it queued did neither).
    assert entered - cancelled_entered <= s.flights + s.joins <= entered, (s, entered)
    assert s.joins >= joiners
    assert s.coalescing_ratio == (s.flights / s.calls if s.calls else 0.0)


# -- the tests ------------------------------------------------------------------------

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=schedules(threads=False), n_keys=st.integers(2, 3))
# A fresh caller cancelled while its claim on the next flight is in transit hands the
# claim back (the next flight, never led, leaves the table).
@example([Call(0), Call(0, fresh=True), Release(0, drain=1), Cancel(1, drain=0)], 2)
# Two fresh callers share the next flight; the first one's work ends at once.
@example(
    [Call(0), Call(0, fresh=True, instant="value"), Call(0, fresh=True), Release(0)], 2
)
# A forget lets a new flight start beside the detached one; a fresh caller that
# waited for the detached one gets the new one.
@example(
    [Call(0), Call(0, fresh=True), Forget(0), Call(0), Release(0, fail=True), Release(0)], 3
)
def test_async_schedules(schedule: list[Step], n_keys: int) -> None:
    world = play(schedule, n_keys, threads=False)
    check(world)
    for note in sorted(world.seen):
        event(note)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=schedules(threads=True), n_keys=st.integers(2, 3))
@example(
    [
        Call(0, thread=True),
        Call(0, fresh=True, thread=True),
        Call(0, fresh=True),
        Call(0),
        Release(0, fail=True),
        Release(0),
    ],
    2,
)
def test_mixed_schedules(schedule: list[Step], n_keys: int) -> None:
    """Async callers and run_sync callers in threads share the flights."""
    world = play(schedule, n_keys, threads=True)
    check(world)
    for note in sorted(world.seen):
        event(note)


# -- fixed schedules ----------------------------------------------------------------------


def test_a_fresh_joiner_of_an_ended_flight_still_gets_on_join() -> None:
    """A fresh caller whose claim finds the next flight already ended (Role.TAKE) joins
    it, and its on_join is called: docs/api.md calls on_join once for each joiner."""
    async def main() -> None:
        g = flightgroup.FlightGroup()
        release = asyncio.Event()
        joins: list[str] = []

        async def slow() -> str:
            await release.wait()
            return "old"

        async def instant() -> str:
            return "new"

        leader = asyncio.create_task(g.run("k", slow))
        await asyncio.sleep(0)
        first = asyncio.create_task(
            g.run("k", instant, fresh=True, on_join=lambda: joins.append("first"))
        )
        second = asyncio.create_task(
            g.run("k", instant, fresh=True, on_join=lambda: joins.append("second"))
        )
        await asyncio.sleep(0)  # both fresh callers wait for the end of "old"
        release.set()
        assert (await leader).value == "old"
        # The first fresh caller leads the next flight, whose work ends at once; the
        # second then finds that flight ended and takes its outcome as a joiner.
        assert (await first).joined is False
        res = await second
        assert (res.value, res.joined) == ("new", True)
        assert joins == ["second"]

    asyncio.run(asyncio.wait_for(main(), 10))
