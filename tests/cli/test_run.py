"""``flightgroup run`` and ``flightgroup status`` as a user runs them: real processes.

Interleavings are forced, never slept into: a command waits for a "go" file that the
test creates only once the other runs said (on stderr) that they joined.
"""

from __future__ import annotations

import json
import os
import queue
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

PY = sys.executable
WAIT = 20.0  # the most any single expected event may take on a loaded machine

# A command for the tests: append a line to JOURNAL, print to stdout and stderr, wait
# for GO to exist (if given), print again, exit with CODE. SIGINT: say so and exit 42.
CMD = r"""
import os, signal, sys, time
journal, go, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
def on_int(signum, frame):
    print("got SIGINT", flush=True)
    sys.exit(42)
signal.signal(signal.SIGINT, on_int)
with open(journal, "a") as f:
    f.write(f"run {os.getpid()}\n")
print(f"out {os.getpid()}", flush=True)
print(f"err {os.getpid()}", file=sys.stderr, flush=True)
end = time.monotonic() + 30
while go != "-" and not os.path.exists(go) and time.monotonic() < end:
    time.sleep(0.01)
print("done", flush=True)
sys.exit(code)
"""


class Reader:
    """Reads a pipe in a thread: lines as they come, and all of it at the end."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[bytes]) -> None:
        for line in pipe:
            self.chunks.append(line)
            self.lines.put(line)

    def wait_for(self, needle: bytes, timeout: float = WAIT) -> bytes:
        """The first line (from now on) that holds ``needle``; fails after ``timeout``."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line with {needle!r}; got {self.text!r}") from None
            if needle in line:
                return line

    @property
    def text(self) -> bytes:
        return b"".join(self.chunks)

    def join(self) -> bytes:
        self._thread.join(WAIT)
        return self.text


class Run:
    """One ``python -m flightgroup ...`` process with both pipes read in threads."""

    def __init__(self, *args: str, **kwargs: object) -> None:
        self.proc = subprocess.Popen(
            [PY, "-m", "flightgroup", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=kwargs.pop("stderr", subprocess.PIPE),
            **kwargs,  # type: ignore[call-overload]
        )
        assert self.proc.stdout is not None
        self.out = Reader(self.proc.stdout)
        self.err = Reader(self.proc.stderr) if self.proc.stderr is not None else None

    def wait(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def place() -> Iterator[Path]:
    """A short folder: the group's directory (``place/d``), the journal and go files."""
    path = Path(tempfile.mkdtemp(prefix="fgc", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    """Every Run a test starts is killed at its end, whatever happened."""
    started: list[Run] = []
    yield started
    for run in started:
        run.kill()


def run_cmd(place: Path, key: str, code: int = 0, *extra: str, wait_go: bool = True) -> list[str]:
    go = str(place / "go") if wait_go else "-"
    return [
        "run", "--key", key, "--dir", str(place / "d"), *extra,
        "--", PY, "-c", CMD, str(place / "journal"), go, str(code),
    ]  # fmt: skip


def status(place: Path) -> dict[str, list[dict[str, object]]]:
    proc = subprocess.run(
        [PY, "-m", "flightgroup", "status", "--dir", str(place / "d"), "--json"],
        capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    parsed: dict[str, list[dict[str, object]]] = json.loads(proc.stdout)
    return parsed


def journal(place: Path) -> list[str]:
    return (place / "journal").read_text().splitlines()


def start_leader(runs: list[Run], place: Path, key: str = "k", code: int = 0) -> Run:
    """A leader in a session of its own (its process group can be killed whole, and
    it has no controlling terminal), once its command is running."""
    leader = Run(*run_cmd(place, key, code), start_new_session=True)
    runs.append(leader)
    leader.out.wait_for(b"out ")
    return leader


def start_joiner(runs: list[Run], place: Path, key: str = "k", *extra: str, **kw: object) -> Run:
    joiner = Run(*run_cmd(place, key, 0, *extra), **kw)
    runs.append(joiner)
    if joiner.err is not None:
        joiner.err.wait_for(b"joined")
    return joiner


@pytest.mark.timeout(40)
def test_three_runs_share_one_run_output_and_exit_code(place: Path, runs: list[Run]) -> None:
    three = [Run(*run_cmd(place, "report", 3)) for _ in range(3)]
    runs.extend(three)
    # Two of them join; only then may the one that leads finish.
    end = time.monotonic() + WAIT
    while sum(b"joined" in run.err.text for run in three if run.err) < 2:
        assert time.monotonic() < end, [run.err.text for run in three if run.err]
        assert all(run.proc.poll() is None for run in three)
        time.sleep(0.01)
    (place / "go").touch()
    codes = [run.wait() for run in three]
    outs = [run.out.join() for run in three]
    errs = [run.err.join() for run in three if run.err]
    assert codes == [3, 3, 3]
    assert len(journal(place)) == 1
    pid = journal(place)[0].split()[1]
    assert outs[0] == f"out {pid}\ndone\n".encode()
    assert outs[0] == outs[1] == outs[2]
    # Every one wrote the leader's stderr; exactly two said they joined, naming the key.
    assert all(f"err {pid}\n".encode() in err for err in errs)
    assert sorted(b"joined the run of 'report'" in err for err in errs) == [False, True, True]
    assert all(b"Traceback" not in err for err in errs)


def test_a_joiner_gets_the_output_live_before_the_leader_ends(place: Path, runs: list[Run]) -> None:
    leader = start_leader(runs, place)
    joiner = start_joiner(runs, place)
    # The leader's first line reaches the joiner while the command still waits.
    line = joiner.out.wait_for(b"out ")
    assert line == leader.out.text.splitlines(keepends=True)[0]
    assert joiner.err is not None
    joiner.err.wait_for(b"err ")
    assert not (place / "go").exists()
    assert joiner.proc.poll() is None
    assert leader.proc.poll() is None
    (place / "go").touch()
    assert joiner.wait() == 0
    assert leader.wait() == 0
    assert joiner.out.join() == leader.out.join()
    assert len(journal(place)) == 1


def test_a_joiner_whose_leader_dies_exits_75(place: Path, runs: list[Run]) -> None:
    leader = start_leader(runs, place)
    joiner = start_joiner(runs, place)
    os.killpg(leader.proc.pid, signal.SIGKILL)  # the leader's process and its command
    assert leader.wait() == -signal.SIGKILL
    assert joiner.wait() == 75
    assert joiner.err is not None
    err = joiner.err.join()
    assert b"stopped before its run ended" in err
    assert b"Traceback" not in err
    assert len(journal(place)) == 1  # the joiner never ran the command itself


def test_a_joiner_past_its_timeout_exits_124_and_the_run_goes_on(
    place: Path, runs: list[Run]
) -> None:
    # The timeout also covers connecting to the group, so it leaves a loaded machine
    # room for that; the go file holds the run far past it, so 124 is forced.
    leader = start_leader(runs, place)
    started = time.monotonic()
    joiner = Run(*run_cmd(place, "k", 0, "--timeout", "4"))
    runs.append(joiner)
    assert joiner.err is not None
    joiner.err.wait_for(b"joined")
    assert joiner.wait() == 124
    assert 4 <= time.monotonic() - started < 4 + WAIT
    err = joiner.err.join()
    assert b"after 4 s (--timeout)" in err
    assert leader.proc.poll() is None
    (place / "go").touch()
    assert leader.wait() == 0
    assert leader.out.join().endswith(b"done\n")


def test_sigint_to_a_joiner_exits_130_and_the_run_goes_on(place: Path, runs: list[Run]) -> None:
    leader = start_leader(runs, place)
    joiner = start_joiner(runs, place)
    assert status(place)["flights"][0]["joiners"] == 1
    joiner.proc.send_signal(signal.SIGINT)
    assert joiner.wait() == 130
    assert joiner.err is not None
    err = joiner.err.join()
    assert b"goes on" in err
    assert b"Traceback" not in err
    # The joiner withdrew; the leader's command was not touched and ends normally.
    assert status(place)["flights"][0]["joiners"] == 0
    assert leader.proc.poll() is None
    (place / "go").touch()
    assert leader.wait() == 0
    assert b"got SIGINT" not in leader.out.join()


def test_sigint_to_the_leader_goes_to_its_command(place: Path, runs: list[Run]) -> None:
    leader = start_leader(runs, place)
    joiner = start_joiner(runs, place)
    leader.proc.send_signal(signal.SIGINT)  # the leader's process only, not its group
    assert leader.wait() == 42
    assert joiner.wait() == 42
    assert b"got SIGINT" in leader.out.join()
    assert joiner.out.join() == leader.out.text
    assert b"got SIGINT" in joiner.out.text


def test_a_command_killed_by_a_signal_gives_128_plus_n(place: Path) -> None:
    proc = subprocess.run(
        [PY, "-m", "flightgroup", "run", "--key", "k", "--dir", str(place / "d"), "--",
         "sh", "-c", "echo before; kill -TERM $$"],
        capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert proc.returncode == 128 + signal.SIGTERM
    assert proc.stdout == b"before\n"
    # A command that is not there: 127, as a shell says, in one line.
    proc = subprocess.run(
        [PY, "-m", "flightgroup", "run", "--key", "k", "--dir", str(place / "d"), "--",
         str(place / "no-such-command")],
        capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert proc.returncode == 127
    assert proc.stderr.count(b"\n") == 1
    assert b"cannot run" in proc.stderr


def test_the_spool_is_framed_private_and_bounded(place: Path) -> None:
    directory = place / "d"
    for _ in range(5):
        proc = subprocess.run(
            [PY, "-m", "flightgroup", "run", "--key", "k", "--dir", str(directory), "--",
             "sh", "-c", "echo o; echo e >&2"],
            capture_output=True, timeout=WAIT, check=False,
        )  # fmt: skip
        assert proc.returncode == 0
    output = directory / "output"
    assert output.stat().st_mode & 0o777 == 0o700
    spools = sorted(output.iterdir(), key=lambda p: int(p.suffix[1:]))
    assert len(spools) == 3  # the newest three of the key's five flights
    assert all(spool.stat().st_mode & 0o777 == 0o600 for spool in spools)
    data = spools[-1].read_bytes()
    assert sorted([data[:7], data[7:]]) == [b"\x01\x00\x00\x00\x02o\n", b"\x02\x00\x00\x00\x02e\n"]


def test_status_json_during_a_flight_and_when_idle(place: Path, runs: list[Run]) -> None:
    assert status(place) == {"flights": []}  # no directory yet: nothing, and nothing made
    assert not (place / "d").exists()
    leader = start_leader(runs, place, key="build:main")
    start_joiner(runs, place, key="build:main")
    flights = status(place)["flights"]
    assert len(flights) == 1
    flight = flights[0]
    assert list(flight) == ["key", "token", "leader_pid", "joiners", "age_s"]
    assert flight["key"] == "build:main"
    assert isinstance(flight["token"], int)
    assert flight["token"] > 0
    assert flight["leader_pid"] == leader.proc.pid
    assert flight["joiners"] == 1
    assert isinstance(flight["age_s"], float)
    assert flight["age_s"] > 0
    # The human table says the same.
    table = subprocess.run(
        [PY, "-m", "flightgroup", "status", "--dir", str(place / "d")],
        capture_output=True, text=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert table.returncode == 0
    assert re.search(rf"build:main\s+{flight['token']}\s+{leader.proc.pid}\s+1\s", table.stdout)
    (place / "go").touch()
    assert leader.wait() == 0
    assert status(place) == {"flights": []}  # the directory exists, its flight ended


def test_a_joiner_on_a_terminal_shows_its_progress_and_not_on_a_pipe(
    place: Path, runs: list[Run]
) -> None:
    # A command that says nothing until go: its joiners wait with no output.
    silent = f"touch {place}/started; while [ ! -e {place}/go ]; do sleep 0.01; done; echo done"
    leader = Run("run", "--key", "k", "--dir", str(place / "d"), "--", "sh", "-c", silent)
    runs.append(leader)
    end = time.monotonic() + WAIT
    while not (place / "started").exists():
        assert time.monotonic() < end
        time.sleep(0.01)
    master, slave = os.openpty()
    try:
        on_tty = Run("run", "--key", "k", "--dir", str(place / "d"), "--", "false", stderr=slave)
        runs.append(on_tty)
    finally:
        os.close(slave)
    on_pipe = Run("run", "--key", "k", "--dir", str(place / "d"), "--", "false")
    runs.append(on_pipe)
    assert on_pipe.err is not None
    on_pipe.err.wait_for(b"joined")
    seen = b""
    pattern = re.compile(rb"\rflightgroup: waiting for 'k' \(leader pid \d+ on [^)]+\): \d+\.\d s")
    while len(pattern.findall(seen)) < 2:  # shown, then rewritten in place
        assert time.monotonic() < end, seen
        if select.select([master], [], [], 0.5)[0]:
            seen += os.read(master, 4096)
    assert b"joined the run of 'k'" in seen
    time.sleep(0.3)  # as long as the tty joiner shows its line: the pipe one shows none
    (place / "go").touch()
    assert on_tty.wait() == 0
    assert on_pipe.wait() == 0
    assert leader.wait() == 0
    rest = b""
    while select.select([master], [], [], 0.2)[0]:  # the rest, then EIO: the slave closed
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        rest += data
    os.close(master)
    assert b"\r\x1b[K" in rest  # the line is wiped before the output and the exit
    assert on_tty.out.join() == on_pipe.out.join() == leader.out.join() == b"done\n"
    err = on_pipe.err.join()
    assert b"joined" in err
    assert b"waiting for" not in err
    assert b"\r" not in err


def test_ctrl_c_on_the_leaders_terminal_reaches_its_command_once(place: Path) -> None:
    # The leader runs in the foreground of a terminal of its own; Ctrl-C there signals
    # the whole foreground group, CMD included, so the leader must not add a second.
    # (Two SIGINTs close together may merge into one: three rounds show a double.)
    count = (
        "import signal, sys, time\n"
        "hits = []\n"
        "signal.signal(signal.SIGINT, lambda s, f: hits.append(s))\n"
        "print('ready', flush=True)\n"
        "for round in (1, 2, 3):\n"
        "    end = time.monotonic() + 20\n"
        "    while len(hits) < round and time.monotonic() < end: time.sleep(0.005)\n"
        "    time.sleep(0.3)\n"  # room for a second SIGINT to arrive
        "    print(f'round {round}: {len(hits)} sigints', flush=True)\n"
        "sys.exit(40 + len(hits))\n"
    )
    take_terminal = (  # own the session's terminal (it has none yet), then be flightgroup
        "import fcntl, os, sys, termios\n"
        "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'flightgroup', *sys.argv[1:]])\n"
    )
    master, slave = os.openpty()
    try:
        leader = subprocess.Popen(
            [PY, "-c", take_terminal, "run", "--key", "k", "--dir", str(place / "d"), "--",
             PY, "-c", count],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(slave)
    seen = b""

    def read_until(needle: bytes) -> None:
        nonlocal seen
        end = time.monotonic() + WAIT
        while needle not in seen:
            assert time.monotonic() < end, seen
            if select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 4096)

    try:
        read_until(b"ready")
        for round in (1, 2, 3):
            os.write(master, b"\x03")  # Ctrl-C
            read_until(f"round {round}:".encode())
        assert leader.wait(WAIT) == 43, seen
        assert b"round 3: 3 sigints" in seen
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
        os.close(master)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["a file", "under a file", "in /proc"])
def test_run_with_a_dir_that_cannot_be_a_directory_group_is_bad_usage(
    place: Path, where: str
) -> None:
    """run with a --dir that cannot be a directory group is bad usage (exit 2)."""
    (place / "afile").touch()
    path = {
        "a file": place / "afile",
        "under a file": place / "afile" / "sub",
        "in /proc": Path("/proc/no-such-flightgroup-folder"),
    }[where]
    proc = run_flightgroup("run", "--key", "k", "--dir", str(path), "--", "true")
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(b"flightgroup: error: cannot use the directory ")
    assert str(path).encode() in line
    if where != "in /proc":  # the reason names the file in the way
        assert f"{str(place / 'afile')!r} is a file, not a directory".encode() in line, line


def run_flightgroup(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [PY, "-m", "flightgroup", *args], capture_output=True, timeout=WAIT, check=False
    )


@pytest.mark.timeout(60)
def test_a_joiners_line_names_the_leaders_pid_and_host_and_the_runs_age(
    place: Path, runs: list[Run]
) -> None:
    """A joiner's line names the leader's pid and host and the run's age."""
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
    """A joiner that cannot learn its leader says so, and names it at the end."""
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
    """--fresh callers wait for the run in flight and share the next run."""
    # The coordinator is a process of its own that outlives the runs of "k": were it
    # the first run's, its exit would hand over coordination while the next run lands,
    # which test_a_landing_made_while_the_coordinator_changes_reaches_the_joiners
    # covers.
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
from flightgroup.directory.closing import Closing
from flightgroup.directory.connection import Connection
from flightgroup.directory.leases import Leases
hold = sys.argv.pop(1)
connect = Connection.connect
disconnected = Connection.disconnected
begin_close = Closing.begin_close
land = Leases.land
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
def _land(self, *args, **kwargs):
    land(self, *args, **kwargs)
    say("landed")
Connection.connect = _connect
Connection.disconnected = _disconnected
Closing.begin_close = _begin_close
Leases.land = _land
from flightgroup.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(60)
def test_a_landing_made_while_the_coordinator_changes_reaches_the_joiners(
    place: Path, runs: list[Run]
) -> None:
    """A landing made while the coordinator changes reaches the joiners.

    The coordinator changes under a leader whose run then lands before it reconnected: its
    call waits until a coordinator took the landing (ADR 0040), which reaches its joiners."""
    # The shape of a --fresh run whose joiner must not be lost: the previous run's
    # leader coordinates and exits (as every `flightgroup run` does) just as the next
    # run, a short one, lands before it has reconnected.
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
    leader.err.wait_for(b"probe: landed")  # ... its call waits for a coordinator
    hold.unlink()  # from now on it may connect again
    assert leader.wait() == 6
    assert joiner.wait() == 6, joiner.err.join() if joiner.err else None
    assert joiner.out.join() == leader.out.join()


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


@pytest.mark.timeout(60)
def test_cli_run_with_a_key_that_is_not_utf8(directory: str) -> None:
    """run with a key that is not UTF-8 runs and shares it like any key."""
    key = os.fsencode("build:") + b"\xff"
    proc = subprocess.run(
        [PY, "-m", "flightgroup", "run", "--key", key, "--dir", directory, "--", "echo", "hi"],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"hi\n"
