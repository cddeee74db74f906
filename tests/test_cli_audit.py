"""``flightgroup run`` and ``status`` where an audit found the tests thin: what a
joiner's line says (the leader's pid and host, the run's age, or why it cannot say),
``--fresh`` against a run in flight, and ``status --watch`` while a flight comes and
goes; and a landing made while the coordinator changes under a leader that then
closes (it was lost: closing stopped reconnecting). Real processes, as in tests/test_cli_run.py
(whose helpers these are).

Interleavings are forced, never slept into: a command waits for a "go" file that the
test creates only once the processes it waits for said (on stderr or stdout) where
they are. Where no output of the command says it, a child process is instrumented
(a ``python -c`` that patches the directory client, then runs
``flightgroup.cli.main``).
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .test_cli_fleet import fleet_cmd
from .test_cli_run import (
    CMD,
    PY,
    Reader,
    Run,
    journal,
    place,
    run_cmd,
    runs,
    start_leader,
    status,
)

__all__ = ["place", "runs"]  # fixtures, used by name

JOINED = re.compile(
    r"flightgroup: joined the run of '(?P<key>[^']*)' in flight "
    r"\(leader pid (?P<pid>\d+) on (?P<host>[^,]+), running for (?P<age>\d+\.\d) s\)\n"
)


class Script(Run):
    """``python -c SCRIPT ARG...``: a flightgroup process with a patch applied first."""

    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [PY, "-c", script, *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.out = Reader(self.proc.stdout)
        self.err = Reader(self.proc.stderr)


def joined_line(run: Run) -> re.Match[str]:
    """The joiner's "joined" line, parsed (it fails the test if it does not match)."""
    assert run.err is not None
    line = run.err.wait_for(b"joined").decode()
    match = JOINED.fullmatch(line)
    assert match is not None, line
    return match


# -- the joiner's line --------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_joiners_line_names_the_leaders_pid_and_host_and_the_runs_age(
    place: Path, runs: list[Run]
) -> None:
    launched = time.monotonic()
    leader = start_leader(runs, place, key="build:main")
    running = time.monotonic()  # the flight started between launched and running
    # Not for ordering (the go file holds the run): the run's age is then at least 1 s,
    # so an age that is always 0 (or the joiner's own) fails below.
    time.sleep(1.0)
    asked = time.monotonic()
    joiner = Run(*run_cmd(place, "build:main", 0))
    runs.append(joiner)
    match = joined_line(joiner)
    answered = time.monotonic()
    assert match["key"] == "build:main"
    # The pid of the leading `flightgroup run` process (docs/cli.md), not its CMD's.
    assert int(match["pid"]) == leader.proc.pid
    [line] = journal(place)
    assert int(line.split()[1]) != leader.proc.pid
    assert match["host"] == socket.gethostname()
    # The flight's age when the joiner asked (printed to 0.1 s).
    assert asked - running - 0.05 <= float(match["age"]) <= answered - launched + 0.05
    (place / "go").touch()
    assert leader.wait() == 0
    assert joiner.wait() == 0
    assert joiner.out.join() == leader.out.join()


@pytest.mark.timeout(60)
def test_a_fleet_joiners_line_names_the_leaders_pid_and_host(
    place: Path, runs: list[Run], redis_server: Any, namespace: str
) -> None:
    leader = Run(*fleet_cmd(place, redis_server.url, namespace, "report", 0))
    runs.append(leader)
    leader.out.wait_for(b"out ")
    joiner = Run(*fleet_cmd(place, redis_server.url, namespace, "report", 0))
    runs.append(joiner)
    match = joined_line(joiner)
    assert match["key"] == "report"
    assert int(match["pid"]) == leader.proc.pid
    assert match["host"] == socket.gethostname()
    assert float(match["age"]) >= 0
    (place / "go").touch()
    assert leader.wait() == 0
    assert joiner.wait() == 0
    assert joiner.out.join() == leader.out.join()
    assert len(journal(place)) == 1


# The joiner's status request fails ("fail") or does not list the flight ("empty",
# as when the flight has just ended): the line must say so, not drop its details.
BLIND_STATUS = r"""
import sys
from flightgroup.directory.client import DirectoryArbiter
from flightgroup.errors import UnavailableError
mode = sys.argv.pop(1)
def status(self, timeout=5.0):
    if mode == "fail":
        raise UnavailableError("refused by\nthe test")
    return []
DirectoryArbiter.status = status
from flightgroup.cli import main
sys.exit(main(sys.argv[1:]))
"""
WHY = {
    "fail": "the status request failed: UnavailableError: refused by the test",
    "empty": "its flight is not in the group's status: it may have just ended",
}


@pytest.mark.timeout(60)
def test_a_joiner_that_cannot_learn_its_leader_says_so_and_names_it_at_the_end(
    place: Path, runs: list[Run]
) -> None:
    leader = start_leader(runs, place, code=4)
    blind = {mode: Script(BLIND_STATUS, mode, *run_cmd(place, "k", 0)) for mode in WHY}
    runs.extend(blind.values())
    for mode, joiner in blind.items():
        assert joiner.err is not None
        line = joiner.err.wait_for(b"joined").decode()
        unknown = f"leader unknown: {WHY[mode]}"
        assert line == f"flightgroup: joined the run of 'k' in flight ({unknown})\n"
    (place / "go").touch()
    assert leader.wait() == 4
    pid, host = leader.proc.pid, socket.gethostname()
    for joiner in blind.values():
        assert joiner.wait() == 4
        assert joiner.out.join() == leader.out.join()  # read from the spool the value names
        assert joiner.err is not None
        err = joiner.err.join().decode()
        assert err.endswith(f"flightgroup: the run of 'k' was led by pid {pid} on {host}\n")
        assert "Traceback" not in err
    assert len(journal(place)) == 1


# -- --fresh ------------------------------------------------------------------------

# A fresh caller sends no output while it waits for the end of the run in flight, so
# this probe says when the coordinator has taken its request: one connection's
# requests are answered in order, so the answer to a status request sent after the run
# request comes after the coordinator took it (and lists the flights at that moment).
FRESH_PROBE = r"""
import sys, threading, time
from flightgroup.directory.client import DirectoryArbiter
submit = DirectoryArbiter.submit
def probed(self, key, **options):
    call = submit(self, key, **options)
    def probe():
        end = time.monotonic() + 20
        while not call.sent and time.monotonic() < end:
            time.sleep(0.005)
        tokens = [f["token"] for f in self.status() if f["key"] == key]
        sys.stderr.write(f"probe: run request taken; flights of the key: {tokens}\n")
        sys.stderr.flush()
    if options["fresh"]:
        threading.Thread(target=probe, daemon=True).start()
    return call
DirectoryArbiter.submit = probed
from flightgroup.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start_keeper(runs: list[Run], place: Path) -> Run:
    """A held run of another key, started first in the directory: it coordinates the
    group until the test lets it end (touches ``go-keeper``)."""
    keeper = Run(
        "run", "--key", "keeper", "--dir", str(place / "d"),
        "--", PY, "-c", CMD, str(place / "journal-keeper"), str(place / "go-keeper"), "0",
    )  # fmt: skip
    runs.append(keeper)
    keeper.out.wait_for(b"out ")
    return keeper


@pytest.mark.timeout(60)
def test_fresh_callers_wait_for_the_run_in_flight_and_share_the_next(
    place: Path, runs: list[Run]
) -> None:
    # The coordinator is a process of its own that outlives the runs of "k": were it
    # the first run's, its exit would hand over coordination while the next run lands,
    # which test_a_landing_made_while_the_coordinator_changes_reaches_the_joiners
    # covers (it fails today).
    keeper = start_keeper(runs, place)
    first = start_leader(runs, place, code=3)
    [token] = [flight["token"] for flight in status(place)["flights"] if flight["key"] == "k"]
    plain = Run(*run_cmd(place, "k", 0))  # a caller without --fresh joins the run
    runs.append(plain)
    assert int(joined_line(plain)["pid"]) == first.proc.pid
    fresh = [Script(FRESH_PROBE, *run_cmd(place, "k", 5, "--fresh")) for _ in range(2)]
    runs.extend(fresh)
    for run in fresh:
        assert run.err is not None
        line = run.err.wait_for(b"probe: ")
        # Taken while the first run was in flight: the case --fresh is for.
        assert line.decode() == f"probe: run request taken; flights of the key: [{token}]\n"
    # They wait for its end: neither joined it nor ran CMD.
    assert all(run.proc.poll() is None for run in fresh)
    assert all(b"joined" not in run.err.text for run in fresh if run.err)
    assert len(journal(place)) == 1
    (place / "go").touch()
    assert first.wait() == 3
    assert plain.wait() == 3
    codes = [run.wait() for run in fresh]  # the next run's own code
    assert codes == [5, 5], [run.err.join().decode() for run in fresh if run.err]
    # Two runs, in order: the first's, then one that both fresh callers share.
    [run1, run2] = journal(place)
    pid1, pid2 = run1.split()[1], run2.split()[1]
    assert pid1 != pid2
    assert first.out.join() == plain.out.join() == f"out {pid1}\ndone\n".encode()
    for run in fresh:
        assert run.out.join() == f"out {pid2}\ndone\n".encode()
        assert run.err is not None
        assert f"err {pid1}".encode() not in run.err.join()
        assert b"Traceback" not in run.err.text
    # One of them led it, the other joined it and names the first as its leader.
    joiners = [run for run in fresh if run.err is not None and b"joined" in run.err.text]
    assert len(joiners) == 1
    [leader2] = [run for run in fresh if run is not joiners[0]]
    assert int(joined_line(joiners[0])["pid"]) == leader2.proc.pid
    (place / "go-keeper").touch()
    assert keeper.wait() == 0


# The leader of "k", instrumented: once its connection to the coordinator is lost, it
# cannot connect again while the file HOLD exists (as if the next coordinator were
# still being elected); it says when it lost the connection and when it began closing.
LATE_RECONNECT = r"""
import os, sys
from flightgroup.directory.client import DirectoryArbiter
from flightgroup.directory.connection import Connection
hold = sys.argv.pop(1)
connect = DirectoryArbiter._connect
disconnected = Connection.disconnected
begin_close = DirectoryArbiter._begin_close
lost = []
def say(text):
    sys.stderr.write(f"probe: {text}\n")
    sys.stderr.flush()
async def _connect(self, *args):
    if lost and os.path.exists(hold):
        raise OSError("the test holds the reconnection")
    return await connect(self, *args)
def _disconnected(self, channel):
    lost.append(channel)
    say("disconnected")
    return disconnected(self, channel)
def _begin_close(self):
    say("closing")
    return begin_close(self)
DirectoryArbiter._connect = _connect
Connection.disconnected = _disconnected
DirectoryArbiter._begin_close = _begin_close
from flightgroup.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(60)
def test_a_landing_made_while_the_coordinator_changes_reaches_the_joiners(
    place: Path, runs: list[Run]
) -> None:
    # Seen first as a --fresh run that lost its joiner: the previous run's leader
    # coordinated, and exited (as every `flightgroup run` does) just as the next run,
    # a short one, landed and closed before it had reconnected.
    keeper = start_keeper(runs, place)  # the coordinator, until it ends below
    hold = place / "hold"
    leader = Script(LATE_RECONNECT, str(hold), *run_cmd(place, "k", 6))
    runs.append(leader)
    leader.out.wait_for(b"out ")
    joiner = Run(*run_cmd(place, "k", 0))
    runs.append(joiner)
    assert int(joined_line(joiner)["pid"]) == leader.proc.pid
    hold.touch()
    (place / "go-keeper").touch()  # the coordinator's process ends: a new one is elected
    assert keeper.wait() == 0
    assert leader.err is not None
    leader.err.wait_for(b"probe: disconnected")
    (place / "go").touch()  # the run lands while its leader is not connected ...
    leader.err.wait_for(b"probe: closing")  # ... and its process begins to close
    hold.unlink()  # from now on it may connect again
    assert leader.wait() == 6
    assert joiner.wait() == 6, joiner.err.join() if joiner.err else None
    assert joiner.out.join() == leader.out.join()


# -- status --watch -----------------------------------------------------------------


@pytest.mark.timeout(60)
def test_status_watch_shows_a_flight_come_and_go(place: Path, runs: list[Run]) -> None:
    # Started before the directory exists: it finds it once the leader makes it.
    watcher = Run("status", "--watch", "--dir", str(place / "d"))
    runs.append(watcher)
    watcher.out.wait_for(b"no flights in progress")
    leader = start_leader(runs, place, key="build:main")
    line = watcher.out.wait_for(b"build:main")
    assert re.fullmatch(rb"build:main\s+\d+\s+%d\s+0\s+\d+\.\d s\n" % leader.proc.pid, line), line
    (place / "go").touch()
    assert leader.wait() == 0
    watcher.out.wait_for(b"no flights in progress")  # a draw after the flight's line
    assert watcher.proc.poll() is None
    watcher.proc.send_signal(signal.SIGINT)
    assert watcher.wait() == 0
    out = watcher.out.join()
    assert b"\x1b" not in out  # a pipe: no screen codes
    assert out.count(b"flightgroup status (") >= 3
    assert watcher.err is not None
    assert b"Traceback" not in watcher.err.join()
