"""A directory group and ``os.fork`` (ADR 0014): a forked child lets go of its parent's
election lock, key locks and sockets, and keeps the user's own files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
)

FORKING_LEADER = r"""
import os, sys, threading, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: on purpose
group = FlightGroup(directory=sys.argv[1], codec=JSON)
group.run_sync("warm", lambda: 0)  # this process coordinates
running = threading.Event()
def work():
    running.set()
    threading.Event().wait()  # leads "k" (its key lock held) until killed
threading.Thread(target=group.run_sync, args=("k", work), daemon=True).start()
running.wait()
child = os.fork()
if child == 0:  # holds copies of every descriptor the parent had, until killed
    os.read(0, 1)
    os._exit(0)
print(child, flush=True)
threading.Event().wait()
"""


@pytest.mark.timeout(60)
def test_a_forked_child_holds_no_lock_or_connection_of_its_parent(directory: str) -> None:
    """A forked child holds no lock nor connection of its coordinating parent.

    A coordinator that leads a flight forks a child, then is killed: while the child lives, the
    joiner is interrupted at once, a new coordinator is elected and a new call of the key leads
    (the child's copies of the election lock, the key lock and the sockets point at /dev/null
    from the fork on)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKING_LEADER, directory],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    child = 0
    group = FlightGroup(directory=directory, codec=JSON, reconnect_timeout=60)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        joined = threading.Event()
        outcome: list[BaseException | object] = []

        def join() -> None:
            try:
                outcome.append(group.run_sync("k", lambda: "joiner ran", on_join=joined.set))
            except BaseException as exc:
                outcome.append(exc)

        joiner = threading.Thread(target=join)
        joiner.start()
        assert joined.wait(20)
        parent.kill()
        parent.wait(20)
        joiner.join(40)  # with the child's copy of the connection, it waited for the child
        assert len(outcome) == 1 and isinstance(outcome[0], FlightInterruptedError), outcome
        result = group.run_sync("k", lambda: "led here")
        assert (result.value, result.joined) == ("led here", False)
        assert result.token >> 32 == 2  # a new term: this process won the election
        os.kill(child, 0)  # the child still lives (and holds nothing of the group)
    finally:
        group.close()
        if parent.poll() is None:
            parent.kill()
            parent.wait(20)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


FORK_KEEPS_USER_FILES = r"""
import os, sys, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)
directory, link = sys.argv[1], sys.argv[2]
os.makedirs(directory, exist_ok=True)
log = open(os.path.join(directory, "app.log"), "a", buffering=1)
group = FlightGroup(directory=link, codec=JSON)  # by another path: a symlink
group.run_sync("warm", lambda: 0)
child = os.fork()
if child == 0:
    log.write("child\n")  # the user's own file stays the user's
    import socket
    held = 0
    for n in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{n}")
        except OSError:  # the listing's own descriptor
            continue
        if target.endswith("flight.lock"):
            held += 1
        elif target.startswith("socket:"):
            sock = socket.socket(fileno=int(n))
            try:
                for name in (sock.getsockname, sock.getpeername):
                    try:
                        held += str(name()).endswith("flight.sock")
                    except OSError:
                        pass
            finally:
                sock.detach()
    print(held, flush=True)  # the group's sockets and election lock it kept
    os._exit(0)
os.waitpid(child, 0)
log.write("parent\n")
group.close()
"""


@pytest.mark.timeout(60)
def test_a_forked_child_keeps_the_users_files_and_drops_sockets_named_by_a_link(
    directory: str, tmp_path: Path
) -> None:
    """A forked child keeps the user's files and drops sockets named by a link."""
    link = str(tmp_path / "link")
    os.makedirs(directory)
    os.symlink(directory, link)
    proc = subprocess.run([sys.executable, "-c", FORK_KEEPS_USER_FILES, directory, link],
                          capture_output=True, text=True, timeout=50, check=False)
    assert proc.returncode == 0, proc.stderr
    # The child kept no socket of the group (it coordinated: listening and accepted
    # sockets, and its own connection, named through the link) and no election lock.
    assert proc.stdout.split() == ["0"], proc.stdout
    with open(os.path.join(directory, "app.log")) as f:
        assert f.read().split() == ["child", "parent"]
