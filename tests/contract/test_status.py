"""status() of the wide scopes: each flight as its caller named it, led by the process that
leads it (a child that uses a group made before its fork too).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
)

from ..infleet import fleet_group
from ..infresh import held
from ..redisproc import RedisServer
from ..support import in_thread, outcome, scope_of

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("scope", ["fleet", "directory"])
def test_status_shows_the_raw_key_of_a_plain_key_that_starts_with_a_nul(
    redis_server: RedisServer, namespace: str, directory: str, scope: str
) -> None:
    """status() shows a plain key that starts with a NUL as its caller gave it.

    A plain key that starts with a NUL is sent with one more (ADR 0019); status() of either wide
    scope shows the raw key."""
    if scope == "fleet":
        g = fleet_group(redis_server.url, namespace)
    else:
        g = FlightGroup(directory=directory, codec=JSON)
    started, release = threading.Event(), threading.Event()
    thread, out = in_thread(g.run_sync, "\x00k", held([], "v", started, release))
    try:
        assert started.wait(10)
        assert scope_of(g) is not None
        keys = [flight["key"] for flight in scope_of(g).status()]
    finally:
        release.set()
        thread.join(10)
        g.close()
    assert outcome(out).value == "v"
    assert keys == ["\x00k"], keys


# Made (not started) before the fork, as a pre-forking server's module-level group: the
# child leads "k" (its work waits on the parent); the parent asks status() through a
# group of its own. Prints the pids as JSON.
_PRE_FORK_GROUP = r"""
import json, os, sys
from flightgroup import JSON, FlightGroup
url, namespace = sys.argv[1], sys.argv[2]
group = FlightGroup(redis=url, namespace=namespace, codec=JSON)  # not started
running_r, running_w = os.pipe()
go_r, go_w = os.pipe()
child = os.fork()
if child == 0:
    def work():
        os.write(running_w, b"r")
        os.read(go_r, 1)
        return "v"
    try:
        group.run_sync("k", work, timeout=20)
    finally:
        os._exit(0)
assert os.read(running_r, 1) == b"r"
probe = FlightGroup(redis=url, namespace=namespace, codec=JSON)
try:
    flights = probe._scope.status(timeout=10)
finally:
    os.write(go_w, b"g")
    os.waitpid(child, 0)
    probe.close()
print(json.dumps({"parent": os.getpid(), "child": child,
                  "leaders": [flight["leader_pid"] for flight in flights]}), flush=True)
"""


def test_a_group_made_before_a_fork_names_the_child_as_the_leader(
    redis_server: RedisServer, namespace: str
) -> None:
    """A group made before a fork and used in the child names the child as leader.

    ADR 0018: a group made but never started before the fork "has nothing of the parent's. It
    works in the child as a new group." Its flights led in the child show the child's pid in
    status() (``flightgroup status``'s LEADER PID, the CLI joiner's "leader pid" line)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PRE_FORK_GROUP, redis_server.url, namespace],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["leaders"] == [seen["child"]], seen
