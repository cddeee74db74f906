"""A fleet group and ``os.fork``: what a forked child may do with its parent's group.

A fleet group's calls run on its background thread's event loop, and ``fork`` copies no
thread. A child forked after the group started (a group at module level, used, then a
``multiprocessing`` "fork" worker) holds a copy of a loop that never runs again: a call
there raises GroupClosedError at once, as the directory scope's does (ADR 0014), instead
of waiting for its own timeout (for ever without one), and ``close()`` returns without
waiting out its whole bound (2 command timeouts and the lease); the copies of the
parent's loop and connections are kept from acting on the parent's (ADR 0018).

Each test runs a script in a child interpreter that forks (forking pytest's own process,
with its threads, is not a state worth testing in); the script's lines say what each
side saw. A child's call and close() get time limits far past what they need, and far
below the waits they must not make.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)

# Forked while its parent leads "held" (its work waits on the parent's go-ahead): the
# child uses the parent's group, then a group of its own that joins "held".
_FORKING_LEADER = r"""
import asyncio, gc, json, os, sys, threading, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: on purpose
url, namespace = sys.argv[1], sys.argv[2]
# A lease far past the test's limit: a child's close() that waited for the lease would
# fail the test.
parent_group = FlightGroup(redis=url, namespace=namespace, codec=JSON, lease=300)
parent_group.run_sync("warm", lambda: 0)
running, release = threading.Event(), threading.Event()
def work():
    running.set()
    release.wait(30)
    return "the parent's value"
led = []
leader = threading.Thread(target=lambda: led.append(parent_group.run_sync("held", work)))
leader.start()
assert running.wait(20)
to_parent_r, to_parent_w = os.pipe()
child = os.fork()
if child == 0:
    out = {}
    def say(**what):
        os.write(to_parent_w, (json.dumps(what) + "\n").encode())
    try:
        out["closed_at_once"] = parent_group.closed
        for name, key in (("parent_group", "used-in-child"), ("parent_group_held", "held")):
            try:  # "held" was in flight in the parent's table when it forked
                parent_group.run_sync(key, lambda: 1, timeout=10)
                out[name] = "served"
            except BaseException as exc:
                out[name] = [type(exc).__name__, str(exc), getattr(exc, "__notes__", [])]
        try:
            parent_group.forget("held")
            out["forget"] = "returned"
        except BaseException as exc:
            out["forget"] = [type(exc).__name__, str(exc)]
        parent_group.close()  # returns without waiting 2 command timeouts and the lease
        out["closed"] = True
        # Collected on a running loop of the child's own: a copied redis-py connection
        # collected there would close itself through the parent's loop's copy (its
        # epoll is shared with the parent, so that would unwatch the parent's socket).
        del parent_group
        async def collect():
            gc.collect()
        asyncio.run(collect())
        own = FlightGroup(redis=url, namespace=namespace, codec=JSON)
        other = own.run_sync("other", lambda: "the child's value", timeout=20)
        out["other"] = [other.value, other.joined]
        joined = threading.Event()
        got = []
        def join():
            try:
                got.append(own.run_sync("held", lambda: "child led held", timeout=20,
                                        on_join=joined.set))
            except BaseException as exc:
                got.append(exc)
        joiner = threading.Thread(target=join)
        joiner.start()
        out["joined"] = joined.wait(20)
        say(stage="joined")
        joiner.join(25)
        held = got[0] if got else None
        out["held"] = [held.value, held.joined] if hasattr(held, "value") else repr(held)
        own.close()
    except BaseException as exc:
        out["error"] = repr(exc)
        say(stage="failed")
    say(**out)
    os._exit(0)
lines = os.fdopen(to_parent_r)
stage = json.loads(lines.readline())
release.set()
result = json.loads(lines.readline())
os.waitpid(child, 0)
leader.join(20)
result["stage"] = stage
result["parent_led"] = [led[0].value, led[0].joined] if led else None
# The parent's connections still work after the child's collection: a flight led here
# and one of the child's keys, which a new call here leads again after forget().
after = parent_group.run_sync("after", lambda: "after", timeout=20)
parent_group.forget("other")
again = parent_group.run_sync("other", lambda: "the parent's again", timeout=20)
result["after"] = [after.value, after.joined, again.value, again.joined]
print(json.dumps(result), flush=True)
parent_group.close()
"""


@pytest.fixture(scope="module")
def forked(redis_server: Any) -> dict[str, Any]:
    """What a child forked from a fleet leader of "held" did (see the script)."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORKING_LEADER, redis_server.url, "fork-leader"],
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_a_parents_fleet_group_used_in_a_forked_child_raises_instead_of_hanging(
    forked: dict[str, Any],
) -> None:
    """A call on the parent's started group raises GroupClosedError at once, naming
    why, instead of waiting on a loop no thread runs; so does a key that was in flight
    in the parent's table at the fork. forget() raises GroupClosedError, as on any
    closed group, and close() returns at once instead of waiting out the lease."""
    assert "error" not in forked, forked
    assert forked["closed_at_once"] is True, forked  # the group counts as closed there
    for outcome in (forked["parent_group"], forked["parent_group_held"]):
        # docs/api.md's text; why, and the parent's pid, in a note
        assert outcome[:2] == ["GroupClosedError", "This flight group is closed."], outcome
        assert len(outcome[2]) == 1 and "This fleet group was started in process" in outcome[2][0]
        assert "make a group of its own here" in outcome[2][0], outcome
    assert forked["forget"][:2] == ["GroupClosedError", "This flight group is closed."], forked
    assert forked["closed"] is True, forked


def test_a_forked_childs_own_fleet_group_joins_the_parents_flight(
    forked: dict[str, Any],
) -> None:
    """The child's own group leads a key of its own and joins the flight its parent
    leads, getting the parent's value; the parent's call is unharmed, and the parent's
    group still leads, joins and forgets after the child collected its copies."""
    assert "error" not in forked, forked
    assert forked["stage"] == {"stage": "joined"}, forked
    assert forked["other"] == ["the child's value", False], forked
    assert forked["joined"] is True, forked
    assert forked["held"] == ["the parent's value", True], forked
    assert forked["parent_led"] == ["the parent's value", False], forked
    assert forked["after"] == ["after", False, "the parent's again", False], forked


_FORK_BEFORE_USE = r"""
import json, os, sys, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)
group = FlightGroup(redis=sys.argv[1], namespace=sys.argv[2], codec=JSON)  # not used yet
child = os.fork()
result = group.run_sync("in-child" if child == 0 else "in-parent", lambda: os.getpid())
if child == 0:
    print(json.dumps(["child", result.value == os.getpid(), result.joined]), flush=True)
    group.close()
    os._exit(0)
_, status = os.waitpid(child, 0)
print(json.dumps(["parent", result.value == os.getpid(), result.joined, status]), flush=True)
group.close()
"""


def test_a_fleet_group_made_but_not_used_before_a_fork_works_in_parent_and_child(
    redis_server: Any,
) -> None:
    """A pre-forking server makes its group at import and forks its workers: a group
    whose thread never started works in the child as a new group, and in the parent."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_BEFORE_USE, redis_server.url, "fork-before-use"],
        capture_output=True, text=True, timeout=50, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = sorted(json.loads(line) for line in proc.stdout.splitlines())
    assert lines == [["child", True, False], ["parent", True, False, 0]], proc.stdout


_FORK_WHILE_STARTING = r"""
import json, os, sys, threading, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)
group = FlightGroup(redis=sys.argv[1], namespace=sys.argv[2], codec=JSON)
inside, go_on = threading.Event(), threading.Event()
arbiter = group._scope
real = arbiter._setup
def setup(loop):
    inside.set()  # the first call is starting the group: it holds the start lock
    go_on.wait(20)
    real(loop)
arbiter._setup = setup
first = threading.Thread(target=lambda: group.run_sync("first", lambda: 1))
first.start()
assert inside.wait(20)
child = os.fork()
if child == 0:
    try:
        group.run_sync("in-child", lambda: 2, timeout=10)
        said = "served"
    except BaseException as exc:
        said = type(exc).__name__
    group.close()
    print(json.dumps(["child", said]), flush=True)
    os._exit(0)
go_on.set()
first.join(20)
os.waitpid(child, 0)
print(json.dumps(["parent", group.run_sync("after", lambda: 3).value]), flush=True)
group.close()
"""


def test_a_fork_while_another_thread_starts_the_fleet_group_raises_in_the_child(
    redis_server: Any,
) -> None:
    """A thread starts the group (held open inside its setup, which runs under the
    start lock) when the main thread forks: the child's copy of that lock would stay
    held for ever, and the group is the parent's. A call in the child raises
    GroupClosedError, and the parent's group goes on."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_WHILE_STARTING, redis_server.url, "fork-starting"],
        capture_output=True, text=True, timeout=50, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = sorted(json.loads(line) for line in proc.stdout.splitlines())
    assert lines == [["child", "GroupClosedError"], ["parent", 3]], proc.stdout


