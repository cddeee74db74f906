"""The command line's edges as a user meets them: bad usage (exit 2, one line, no
traceback), the default directory, ``status --watch``, ``bench`` without a checkout,
and the output records the fleet scope carries in its value."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightgroup.command import _Run
from flightgroup.command_spool import STDERR, STDOUT, Capture, RecordReader, frame

PY = sys.executable
WAIT = 20.0


@pytest.fixture
def place() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fgu", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def flightgroup(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "flightgroup", *args],
        capture_output=True, text=True, timeout=WAIT, check=False, env=env, cwd=cwd,
    )  # fmt: skip


def test_bad_usage_exits_2_with_one_line_and_runs_nothing(place: Path) -> None:
    marker = place / "ran"
    cmd = ["--", "touch", str(marker)]
    d = str(place / "d")
    redis = ["--redis", "redis://127.0.0.1:1/0"]  # nothing listens on port 1
    cases = {
        "no --": ["run", "--key", "k", "--dir", d, "touch", str(marker)],
        "no CMD": ["run", "--key", "k", "--dir", d, "--"],
        "no key": ["run", "--dir", d, *cmd],
        "empty key": ["run", "--key", "", "--dir", d, *cmd],
        "both scopes": ["run", "--key", "k", "--dir", d, *redis, "--namespace", "n", *cmd],
        "redis, no namespace": ["run", "--key", "k", *redis, *cmd],
        "namespace, no redis": ["run", "--key", "k", "--namespace", "n", *cmd],
        "unreachable or unbuilt fleet": ["run", "--key", "k", *redis, "--namespace", "n", *cmd],
        "socket path too long": ["run", "--key", "k", "--dir", str(place / ("x" * 120)), *cmd],
        "unknown option": ["run", "--key", "k", "--bogus", *cmd],
        "status: both scopes": ["status", "--dir", d, *redis, "--namespace", "n"],
        "status: redis, no namespace": ["status", *redis],
        "status: unreachable or unbuilt fleet": ["status", *redis, "--namespace", "n"],
        "status: a CMD": ["status", "--dir", d, *cmd],
        "unknown command": ["no-such-command"],
    }
    for timeout in ("abc", "-1", "0", "nan", "inf", ""):
        cases[f"timeout {timeout!r}"] = ["run", "--key", "k", "--dir", d, "--timeout", timeout]
        cases[f"timeout {timeout!r}"] += cmd
    # All at once: each is an interpreter's start, and they are independent.
    procs = {
        name: subprocess.Popen(
            [PY, "-m", "flightgroup", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in cases.items()
    }  # fmt: skip
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 2, (name, proc.returncode, err)
        assert "Traceback" not in err, (name, err)
        assert err.count("\n") == 1, (name, err)
        assert err.startswith("flightgroup: error: "), (name, err)
        assert out == "", (name, out)
    assert not marker.exists()
    # Bad usage changes nothing: the group directories named are not made.
    assert sorted(os.listdir(place)) == [], os.listdir(place)
    # The fleet case says which: the fleet scope is not built, or Redis is unreachable.
    _, err = procs["unreachable or unbuilt fleet"].communicate()
    assert "fleet scope is not available" in err or "127.0.0.1" in err or "reach" in err, err


def test_a_directory_on_a_network_file_system_exits_2(place: Path) -> None:
    # The kernel says NFS (as /proc/self/mountinfo would on such a mount).
    script = (
        "import sys\n"
        "import flightgroup.directory.fs as fs\n"
        "fs.file_system_of = lambda real, mountinfo=None: 'nfs4'\n"
        "from flightgroup.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for args in (
        ["run", "--key", "k", "--dir", str(place / "d"), "--", "touch", str(place / "ran")],
        ["status", "--dir", str(place)],
    ):
        proc = subprocess.run(
            [PY, "-c", script, *args], capture_output=True, text=True, timeout=WAIT, check=False
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert "network file system (NFSv4)" in proc.stderr
    assert not (place / "ran").exists()


def test_the_default_directory(place: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "TMPDIR")}
    runtime = place / "runtime"
    runtime.mkdir(mode=0o700)
    proc = flightgroup(
        "run", "--key", "k", "--", "true", env={**env, "XDG_RUNTIME_DIR": str(runtime)}
    )
    assert proc.returncode == 0, proc.stderr
    assert len(list((runtime / "flightgroup" / "output").iterdir())) == 1
    # No XDG_RUNTIME_DIR: a 0700 folder named for the uid in the temp dir.
    tmp = place / "tmp"
    tmp.mkdir()
    proc = flightgroup("run", "--key", "k", "--", "true", env={**env, "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr
    folder = tmp / f"flightgroup-{os.getuid()}"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert len(list((folder / "output").iterdir())) == 1
    # One that others may write (planted in the shared temp dir) is refused.
    folder.chmod(0o777)
    proc = flightgroup("run", "--key", "k", "--", "true", env={**env, "TMPDIR": str(tmp)})
    assert proc.returncode == 2
    assert "only you can write" in proc.stderr
    # --help says where it is.
    help_text = flightgroup("run", "--help", env={**env, "TMPDIR": str(tmp)}).stdout
    assert "$XDG_RUNTIME_DIR/flightgroup" in help_text
    assert f"{tmp}/flightgroup-{os.getuid()}" in help_text
    # With XDG_RUNTIME_DIR set, it names the one it uses there.
    env_runtime = {**env, "TMPDIR": str(tmp), "XDG_RUNTIME_DIR": str(runtime)}
    help_text = flightgroup("run", "--help", env=env_runtime).stdout
    assert f"here: {runtime}/flightgroup." in " ".join(help_text.split())


def test_status_watch_redraws_until_ctrl_c(place: Path) -> None:
    proc = subprocess.Popen(
        [PY, "-m", "flightgroup", "status", "--watch", "--dir", str(place / "d")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    first = b""
    while b"no flights in progress" not in first:
        line = proc.stdout.readline()
        assert line, first
        first += line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    # A pipe is not a screen: no clearing codes (tests/cli/test_status.py checks that a
    # terminal's screen is cleared).
    assert first.startswith(b"flightgroup status (")
    assert b"Traceback" not in err


def test_bench_needs_a_source_checkout(place: Path) -> None:
    # flightgroup as a wheel installs it: the package alone, no benchmarks beside it.
    site = place / "site"
    shutil.copytree(
        Path(__file__).resolve().parents[2] / "src" / "flightgroup", site / "flightgroup"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = flightgroup("bench", "--quick", env=env, cwd=place)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "needs a source checkout" in proc.stderr
    help_text = flightgroup("bench", "--help").stdout
    assert "--quick" in help_text


def test_output_records_survive_pieces_and_the_fleet_budget(
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    reader = RecordReader()
    data = frame(STDOUT, b"hello\n") + frame(STDERR, b"oops\n") + frame(STDOUT, b"bye\n")
    got = []
    for i in range(len(data)):  # a byte at a time, as a growing file may show it
        got += reader.feed(data[i : i + 1])
    assert got == [(STDOUT, b"hello\n"), (STDERR, b"oops\n"), (STDOUT, b"bye\n")]
    assert reader.pending == 0
    # The fleet's capture keeps the newest records within its budget.
    capture = Capture(budget=2 * (5 + 4))
    for word in (b"one\n", b"two\n", b"six\n"):
        capture.write(STDOUT, word)
    assert capture.dropped == 4
    # A fleet joiner prints the value's records at the end, each on its own stream.
    run = _Run.__new__(_Run)
    run.key, run.follower = "k", None
    value = {"exit": 5, "spool": None, "output": capture.encode(), "dropped": capture.dropped}
    assert run.finish_joined(value) == 5
    out, err = capfdbinary.readouterr()
    assert out == b"two\nsix\n"
    assert b"first 4 bytes" in err


def test_status_leaves_nothing_in_a_folder_no_group_used(place: Path) -> None:
    """`status` changes nothing (docs/cli.md), also pointed at any folder by mistake."""
    (place / "mine").write_text("mine")
    done = flightgroup("status", "--dir", str(place), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"flights": []}
    assert sorted(os.listdir(place)) == ["mine"]
