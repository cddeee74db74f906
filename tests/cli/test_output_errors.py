"""``flightgroup run``: what the leader does when writing CMD's output to its own stdout
fails. Real processes, real pipes and devices.

- The reader went away (``flightgroup run ... -- yes | head -1``): as in a shell
  pipeline, CMD gets SIGPIPE and the run ends (the leader never reads on into its spool
  for ever).
- A write error (``> /dev/full``): said on stderr, exit 1 when CMD succeeded, as ``cat``
  does (never silence and 0).
- A stdout left non-blocking by whoever made the pipe: waited for, nothing lost (not
  everything after the first full pipe buffer dropped with exit 0).
"""

from __future__ import annotations

import array
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from ..support import wait_until
from .test_run import Run, journal, place, runs, start_leader, status

__all__ = ["place", "runs"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(60)

PY = sys.executable
WAIT = 20.0


def _run(place: Path, *cmd: str) -> list[str]:
    return [PY, "-m", "flightgroup", "run", "--key", "k", "--dir", str(place / "d"), "--", *cmd]


def test_the_leaders_reader_going_away_ends_the_command_as_a_pipeline_does(
    place: Path,
) -> None:
    yes = shutil.which("yes")
    assert yes is not None, "coreutils' yes"
    leader = subprocess.Popen(
        _run(place, yes), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert leader.stdout is not None
        assert leader.stdout.readline() == b"y\n"
        leader.stdout.close()  # `| head -1`
        # yes dies of SIGPIPE, and the run ends with its status (128 + 13).
        assert leader.wait(WAIT) == 141
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
    spools = [p for p in (place / "d").rglob("*") if p.is_file() and "spool" in str(p)]
    assert all(p.stat().st_size < 64 * 1024 * 1024 for p in spools), spools


@pytest.mark.parametrize(
    ("code", "exits"),
    [
        ("print('lost')", 1),  # CMD succeeded: the lost output makes it 1
        ("print('lost'); raise SystemExit(7)", 7),  # CMD's own failure stays
    ],
)
def test_a_write_error_on_the_leaders_stdout_is_said(place: Path, code: str, exits: int) -> None:
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            _run(place, PY, "-c", code),
            stdout=full, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=WAIT,
            check=False,
        )  # fmt: skip
    assert done.returncode == exits
    assert b"cannot write the command's stdout: No space left on device" in done.stderr


def test_a_non_blocking_stdout_is_waited_for_and_nothing_is_lost(place: Path) -> None:
    size = 2_000_000
    read_fd, write_fd = os.pipe()
    flags = fcntl.fcntl(write_fd, fcntl.F_GETFL)
    fcntl.fcntl(write_fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)  # as Node.js leaves it
    got: list[bytes] = []
    reading = threading.Event()

    def read_all() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            reading.wait(WAIT)  # only once the pipe is full and the leader must wait
            while chunk := pipe.read(4096):
                got.append(chunk)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    code = f"import sys; sys.stdout.buffer.write(b'x' * {size})"
    leader = subprocess.Popen(
        _run(place, PY, "-c", code), stdout=write_fd, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(write_fd)
    try:
        # Read only once the pipe is full: the leader's next write met EAGAIN.
        capacity = fcntl.fcntl(read_fd, fcntl.F_GETPIPE_SZ)
        end = time.monotonic() + WAIT
        while _unread(read_fd) < capacity and leader.poll() is None:
            assert time.monotonic() < end, "the pipe never filled"
            time.sleep(0.005)
        reading.set()
        assert leader.wait(WAIT) == 0
        reader.join(WAIT)
        assert sum(map(len, got)) == size
        assert leader.stderr is not None and leader.stderr.read() == b""
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` (FIONREAD)."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


@pytest.mark.parametrize("closed", [1, 2])
def test_a_closed_stdout_or_stderr_passes_nothing_and_the_run_succeeds(
    place: Path, closed: int
) -> None:
    """`>&-` / `2>&-`: fd 1 or 2 is closed at start. The group's own descriptors (its
    event loop's epoll, a socket) never take that number, so CMD's output is never written
    into them, and a run that succeeded exits 0."""
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    done = subprocess.run(
        _run(place, PY, "-c", code),
        stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT, check=False,
        preexec_fn=lambda: os.close(closed),
    )  # fmt: skip
    assert done.returncode == 0, done
    shown = done.stderr if closed == 1 else done.stdout
    assert shown == (b"err\n" if closed == 1 else b"out\n")


TICKS = r"""
import os, sys, time
go = sys.argv[1]
while not os.path.exists(go):
    print("tick", flush=True)
    time.sleep(0.05)
print("done", flush=True)
"""


def _sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_joiners_reader_going_away_ends_that_joiner_only(place: Path, sigint: str) -> None:
    """`flightgroup run ... | head -1` as a joiner: it exits 141 quietly at its next
    write, while the run goes on for the leader (it does not follow the whole run). Also
    when it was started with SIGINT ignored (a background job of a script):
    a SIGINT from outside is still ignored, its own withdrawal is not."""
    go = place / "go"
    cmd = _run(place, PY, "-c", TICKS, str(go))
    started = _sigint_ignored if sigint == "ignored" else None
    leader = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        preexec_fn=started,
    )
    assert leader.stdout is not None
    assert leader.stdout.readline() == b"tick\n"  # the leader runs CMD
    joiner = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        preexec_fn=started,
    )
    try:
        assert joiner.stdout is not None
        assert joiner.stdout.readline() == b"tick\n"  # the joiner follows its output
        if sigint == "ignored":
            joiner.send_signal(signal.SIGINT)  # ignored, as it was when it started
            for _ in range(3):
                assert joiner.stdout.readline() == b"tick\n"  # it follows on
            assert joiner.poll() is None
        joiner.stdout.close()
        assert joiner.wait(WAIT) == 141
        assert joiner.stderr is not None
        assert b"joined the run" in joiner.stderr.read()
        assert leader.poll() is None  # the run goes on
        go.touch()
        leader.stdout.read()
        assert leader.wait(WAIT) == 0
    finally:
        go.touch()
        for proc in (leader, joiner):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_closed_stdin_is_dev_null_for_the_command(place: Path) -> None:
    """`<&-`: CMD gets /dev/null as its stdin, not a closed fd 0 its first open() takes."""
    code = "import os; print(os.path.realpath('/proc/self/fd/0'))"
    done = subprocess.run(
        _run(place, PY, "-c", code), capture_output=True, timeout=WAIT, check=False,
        preexec_fn=lambda: os.close(0),
    )  # fmt: skip
    assert done.returncode == 0, done
    assert done.stdout == b"/dev/null\n"


def test_a_joiner_with_its_stderr_closed_passes_on_the_leaders_output_and_code(
    place: Path, runs: list[Run]
) -> None:
    """A joiner with its stderr closed passes on the leader's output and exit code."""
    leader = start_leader(runs, place, code=5)
    # fd 2 closed in the joiner (`2>&-`): Python's sys.stderr is None there.
    cmd = ["run", "--key", "k", "--dir", str(place / "d"), "--", PY, "-c", "raise SystemExit(9)"]
    joiner = Run(*cmd, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    runs.append(joiner)
    wait_until(
        lambda: status(place)["flights"][0]["joiners"] == 1, "the joiner joined the leader's run"
    )
    (place / "go").touch()
    assert leader.wait() == 5
    assert joiner.wait() == 5
    pid = journal(place)[0].split()[1]
    assert joiner.out.join() == f"out {pid}\ndone\n".encode()
