"""A process that forks while its groups work (ADR 0030): what the child gets.

Forks at hostile moments: each scenario runs in a child interpreter of its own (it
forks; pytest must not), which forces its interleaving with events and at-fork hooks,
reaps the forked grandchild within a bound (a grandchild that hangs is killed and
reported as "HANG"), and prints one JSON line of what happened:

- a lock that another thread held at the fork (a table's, the lease's, the exporters')
  must not stay held in the child;
- flights copied from the parent's tables have no leader in the child: its calls lead
  anew (the process scope, and a wide group not started before the fork);
- a work that forks: the child's copy holds no lease of the scope (LeaseLostError);
- a socket made but not yet connected or bound at the fork must not stay the child's
  (the directory's client and coordinator), nor a fleet group's connections made while
  another thread started it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(90)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = r'''
import asyncio, json, os, signal, socket, sys, threading, time, types, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
signal.alarm(60)
from flightgroup import JSON, FlightGroup, LeaseLostError, current_lease

def reap(pid, limit=10.0):
    """The grandchild's exit code, or "HANG" (then it is killed) after ``limit`` s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "HANG"

def in_child(body, limit=10.0):
    """Fork; the child runs ``body()`` and sends back what it returns (JSON)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(0)
        try:
            said = body()
        except BaseException as exc:
            said = {"raised": type(exc).__name__}
        os.write(w, json.dumps(said).encode())
        os._exit(0)
    os.close(w)
    return pid, r

def heard(pid, r, limit=10.0):
    rc = reap(pid, limit)
    data = os.read(r, 65536)
    os.close(r)
    return {"rc": rc, "said": json.loads(data) if data else None}

def group(scope, **options):
    if scope == "directory":
        return FlightGroup(directory=ARGS["directory"], codec=JSON, **options)
    if scope == "fleet":
        return FlightGroup(redis=ARGS["url"], namespace=ARGS["namespace"], codec=JSON, **options)
    return FlightGroup(**options)

def unix_sockets_on(path):
    """This process's Unix sockets bound or connected to ``path``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=int(name))
        except OSError:
            continue
        try:
            if s.family == socket.AF_UNIX:
                for address in (s.getsockname, s.getpeername):
                    try:
                        if address() == path:
                            found.append(int(name))
                    except OSError:
                        pass
        finally:
            s.detach()
    return found
'''


def run(script: str, **args: Any) -> dict[str, Any]:
    """Run ``PRELUDE + script`` with ``ARGS = args``; its last stdout line, as JSON."""
    source = PRELUDE + f"ARGS = {args!r}\n" + script
    done = subprocess.run(
        [sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True, timeout=80
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def _fleet_args(request: pytest.FixtureRequest, scope: str) -> dict[str, Any]:
    if scope == "directory":
        return {"directory": request.getfixturevalue("directory")}
    if scope == "fleet":
        server = request.getfixturevalue("redis_server")
        return {"url": server.url, "namespace": request.getfixturevalue("namespace")}
    return {}


# -- the process scope ------------------------------------------------------------------

LEADING_THREAD = r'''
g = FlightGroup()
running, release = threading.Event(), threading.Event()
def work():
    running.set()
    release.wait(20)
    return "parent"
results = []
leader = threading.Thread(target=lambda: results.append(g.run_sync("k", work)), daemon=True)
leader.start()
running.wait(10)
joiner = threading.Thread(target=lambda: results.append(g.run_sync("k", lambda: "never")))
joiner.start()
while g.stats().joins < 1:
    time.sleep(0.001)

def body():
    if ARGS["how"] == "async":
        async def child_work():
            return "child"
        result = asyncio.run(g.run("k", child_work))
    else:
        result = g.run_sync("k", lambda: "child")
    return {"value": result.value, "joined": result.joined, "in_flight": g.stats().in_flight}

pid, r = in_child(body)
out = heard(pid, r)
release.set()
leader.join(10)
joiner.join(10)
out["parent"] = sorted((x.value, x.joined) for x in results)
print(json.dumps(out))
'''


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_child_forked_while_a_thread_leads_a_key_leads_it_anew(how: str) -> None:
    """The process scope: the flight of k (led by a thread, joined by another) is copied
    into the child with no thread to end it: the child's call of k leads anew (it never
    joins that copy and waits for ever), and the parent's flight is untouched."""
    out = run(LEADING_THREAD, how=how)
    assert out["rc"] == 0, out
    assert out["said"] == {"value": "child", "joined": False, "in_flight": 0}
    assert out["parent"] == [["parent", False], ["parent", True]]


KEPT_THREADS = r'''
g = FlightGroup(deadline=0.2, max_deadline_threads=1)
release = threading.Event()
try:
    g.run_sync("a", lambda: release.wait(20))
except Exception as exc:
    assert type(exc).__name__ == "FlightTimeoutError", exc
assert (g.stats().threads, g.stats().left_threads) == (1, 1)

def body():
    s = g.stats()
    before = [s.threads, s.left_threads]
    # (with the parent's left thread counted here, it would wait for room and time out)
    value = g.run_sync("b", lambda: "child").value
    s = g.stats()
    return {"before": before, "value": value, "after": [s.threads, s.left_threads]}

pid, r = in_child(body)
out = heard(pid, r)
release.set()
print(json.dumps(out))
'''


def test_a_forked_child_has_none_of_its_parent_s_kept_or_left_threads() -> None:
    """A forked child has none of the parent's kept threads nor its threads left past a
    deadline: its attempts under a deadline run on threads of its own, not held back by
    the parent's bound."""
    out = run(KEPT_THREADS)
    assert out["rc"] == 0, out
    assert out["said"] == {"before": [0, 0], "value": "child", "after": [1, 0]}


HELD_LOCKS = r'''
import flightgroup.lease as lease_module
import flightgroup.prometheus as prom
from prometheus_client import CollectorRegistry
g = FlightGroup()
g.run_sync("warm", lambda: 1)
registry = CollectorRegistry()
collector = prom.register(g, registry)
holding = {
    "table": lambda: g._table.lock,
    "lease": lambda: lease_module._LOSS_LOCK,
    "collectors": lambda: prom._COLLECTORS_LOCK,
    "collector": lambda: collector._lock,
}[ARGS["lock"]]()
held, forked = threading.Event(), threading.Event()
def holder():
    with holding:  # as a call, a lease's loss or a scrape holds it, for a moment
        held.set()
        forked.wait(20)
threading.Thread(target=holder, daemon=True).start()
held.wait(10)

def body():
    async def work():
        try:  # takes the lease's lock
            await asyncio.wait_for(current_lease().wait_lost(), 0.01)
        except TimeoutError:
            pass
        return "child"
    value = asyncio.run(g.run("new", work)).value
    stats = g.stats().flights
    other = prom.register(FlightGroup(), CollectorRegistry())  # the collectors' lock
    collector.add("second", FlightGroup()._table)  # the collector's own lock
    names = sorted(m.name for m in collector.collect())
    return {"value": value, "flights": stats, "exported": bool(names) and other is not None}

pid, r = in_child(body, limit=8)
out = heard(pid, r, limit=8)
forked.set()
print(json.dumps(out))
'''


@pytest.mark.parametrize("lock", ["table", "lease", "collectors", "collector"])
def test_a_lock_another_thread_held_at_the_fork_is_free_in_the_child(lock: str) -> None:
    """A lock copied while another thread of the parent held it would stay held in the
    child for ever: the child's first call (the table's lock), a work's wait_lost (the
    lease's) and registering and scraping metrics (the exporter's) find it free."""
    out = run(HELD_LOCKS, lock=lock)
    assert out["rc"] == 0, out
    assert out["said"] == {"value": "child", "flights": 2, "exported": True}


# -- the wide scopes ----------------------------------------------------------------------

NOT_STARTED = r'''
g = group(ARGS["scope"])  # made, not used yet
arbiter = g._scope
real = arbiter._ensure_started
at_start, forked = threading.Event(), threading.Event()
def paused():
    if not at_start.is_set():
        at_start.set()
        forked.wait(20)
    return real()
arbiter._ensure_started = paused
results = []
first = threading.Thread(target=lambda: results.append(g.run_sync("k", lambda: "parent")))
first.start()
at_start.wait(10)  # its flight of k is in the table; the group is not started

def body():
    out = {}
    for key in ("other", "k"):
        result = g.run_sync(key, lambda: "child")
        out[key] = [result.value, result.joined]
    return out

pid, r = in_child(body)
out = heard(pid, r)
forked.set()
first.join(20)
out["parent"] = [x.value for x in results]
g.close()
print(json.dumps(out))
'''


@pytest.mark.parametrize("scope", ["directory", "fleet"])
def test_a_group_forked_before_its_first_call_started_it_works_in_the_child(
    request: pytest.FixtureRequest, scope: str
) -> None:
    """A wide group not started at the fork works in the child as a new group (ADR 0014,
    0018). Its first call had put k in its table when the fork came: the child's call of
    k never joins that flight, which nobody here ends."""
    out = run(NOT_STARTED, scope=scope, **_fleet_args(request, scope))
    assert out["rc"] == 0, out
    assert out["said"] == {"other": ["child", False], "k": ["child", False]}
    assert out["parent"] == ["parent"]


FORK_IN_WORK = r'''
g = group(ARGS["scope"])
r, w = os.pipe()
child = None
def work():
    global child
    child = os.fork()
    if child == 0:
        signal.alarm(0)
        lease = current_lease()
        os.write(w, json.dumps({"lost": lease.lost}).encode() + b"\n")
        return "child's"
    return "parent's"
try:
    result = g.run_sync("k", work)
    outcome = {"value": result.value, "token": result.token}
except BaseException as exc:
    outcome = {"raised": type(exc).__name__}
if child == 0:
    os.write(w, json.dumps(outcome).encode() + b"\n")
    os._exit(0)
os.close(w)
rc = reap(child)
said = [json.loads(line) for line in os.read(r, 65536).decode().splitlines()]
g.close()
print(json.dumps({"rc": rc, "parent": outcome, "child": said}))
'''


@pytest.mark.parametrize("scope", ["directory", "fleet"])
def test_a_work_that_forks_leaves_its_child_no_lease(
    request: pytest.FixtureRequest, scope: str
) -> None:
    """The child's copy of a work holds neither the key lock nor the scope's lease: its
    lease reads lost, and its call raises LeaseLostError, never returns a leader's Result
    under the parent's token."""
    out = run(FORK_IN_WORK, scope=scope, **_fleet_args(request, scope))
    assert out["rc"] == 0, out
    assert out["parent"]["value"] == "parent's"
    assert out["child"] == [{"lost": True}, {"raised": "LeaseLostError"}]


SOCKET_AT_FORK = r'''
import flightgroup.directory.connection as connection
import flightgroup.directory.server as server
directory = ARGS["directory"]
path = os.path.join(directory, "flight.sock")
if ARGS["side"] == "client":  # another process coordinates
    import subprocess
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; from flightgroup import FlightGroup, JSON; "
         "g = FlightGroup(directory=sys.argv[1], codec=JSON); g.run_sync('w', lambda: 0); "
         "print('ready', flush=True); sys.stdin.read()", directory],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline().strip() == "ready"
module = connection if ARGS["side"] == "client" else server
made, go = threading.Event(), threading.Event()
def paused_socket(*args, **kwargs):
    s = socket.socket(*args, **kwargs)
    if not made.is_set():  # the group's socket, before it is connected or bound
        made.set()
        go.wait(20)
    return s
module.socket = types.SimpleNamespace(**vars(socket))
module.socket.socket = paused_socket
g = FlightGroup(directory=directory, codec=JSON)
starting = threading.Thread(target=lambda: g.run_sync("warm", lambda: 0))
starting.start()
made.wait(10)
# The fork comes while the socket names no path yet. The socket goes on once the fork
# is done and the child's at-fork hooks ran (where nothing holds a fork back) or, if
# the fork waits, after a while: either way the child then looks at what it holds.
begun, done = threading.Event(), threading.Event()
hooked_r, hooked_w = os.pipe()
os.register_at_fork(before=begun.set, after_in_parent=done.set)
def go_on():
    begun.wait(10)
    if done.wait(1.0):
        os.read(hooked_r, 1)  # the child's at-fork hooks are done
    go.set()
threading.Thread(target=go_on, daemon=True).start()

def body():
    os.write(hooked_w, b"x")
    deadline = time.monotonic() + 5
    # the parent connects (binds) its copy now: wait until it has, then look
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    return {"held": unix_sockets_on(path)}

pid, r = in_child(body)
out = heard(pid, r)
starting.join(20)
g.close()
if ARGS["side"] == "client":
    other.stdin.close()
    other.wait(20)
print(json.dumps(out))
'''


@pytest.mark.parametrize("side", ["client", "coordinator"])
def test_a_fork_between_a_sockets_creation_and_its_connect_or_bind(
    directory: str, side: str
) -> None:
    """A socket of a directory group names no path between its socket() and its
    connect() (a client) or bind() (the coordinator): a fork waits until the socket is
    connected or bound, so a child forked then lets it go and never holds the parent's
    connection (a dead leader's joiners would never be told) or listener (peers of a dead
    coordinator would wait out a handshake) for as long as it lives."""
    out = run(SOCKET_AT_FORK, directory=directory, side=side)
    assert out["rc"] == 0, out
    assert out["said"] == {"held": []}, out


FLEET_MID_START = r'''
import redis
import flightgroup.scope.loop as loop_module
admin = redis.Redis.from_url(ARGS["url"])
g = group("fleet")
arbiter = g._scope
real = loop_module.start_loop
connected, forked = threading.Event(), threading.Event()
def paused(name, setup):
    loop, thread = real(name, setup)
    while not (arbiter._ready is not None and arbiter._ready.done()):
        time.sleep(0.005)  # its startup has connected to Redis
    connected.set()
    forked.wait(20)  # the group's loop is not stored yet when the fork comes
    return loop, thread
loop_module.start_loop = paused
before = {c["id"] for c in admin.client_list()}
starting = threading.Thread(target=lambda: g.run_sync("k", lambda: "v"))
starting.start()
connected.wait(10)
pid = os.fork()
if pid == 0:
    signal.alarm(0)
    time.sleep(30)  # a worker that lives on and never touches the group
    os._exit(0)
forked.set()
starting.join(20)
mine = {c["id"] for c in admin.client_list()} - before
g.close()
deadline = time.monotonic() + 5
while time.monotonic() < deadline:
    left = mine & {c["id"] for c in admin.client_list()}
    if not left:
        break
    time.sleep(0.05)
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
print(json.dumps({"made": len(mine), "left": sorted(left)}))
'''


def test_a_fleet_group_forked_while_another_thread_starts_it(
    redis_server: Any, namespace: str
) -> None:
    """The child of a fork that came while another thread started a fleet group (its
    loop connected, not yet stored) lets go of its copies of the parent's connections as
    of a started group's (ADR 0018): once the parent closed its group, Redis has none of
    them left, though the child lives."""
    out = run(FLEET_MID_START, url=redis_server.url, namespace=namespace)
    assert out["made"] > 0, out
    assert out["left"] == [], out


FIRST_GROUPS_AT_ONCE = r"""
import flightgroup.directory.forked as forked
real = os.path.realpath
meet = threading.Barrier(2)
def realpath(path, *args, **kwargs):
    if sys._getframe(1).f_code.co_name == "watch":
        meet.wait(10)  # both threads are in watch() at once
    return real(path, *args, **kwargs)
os.path.realpath = realpath
made = []
threads = [
    threading.Thread(target=lambda i=i: made.append(
        FlightGroup(directory=os.path.join(ARGS["root"], f"d{i}"), codec=JSON)))
    for i in range(2)
]
for t in threads:
    t.start()
for t in threads:
    t.join(20)
os.path.realpath = real
pid, r = in_child(lambda: {"forked": True}, limit=8)
out = heard(pid, r, limit=8)
for g in made:
    g.close()
print(json.dumps(out))
"""


def test_a_fork_after_two_threads_made_their_first_directory_groups_at_once(
    tmp_path: Any,
) -> None:
    """The fork guard's hooks are registered once, by the first directory group made,
    though two threads make their first groups at once: a fork of the process takes the
    guard once and never waits on itself."""
    out = run(FIRST_GROUPS_AT_ONCE, root=str(tmp_path))
    assert out == {"rc": 0, "said": {"forked": True}}
