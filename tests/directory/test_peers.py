"""The coordinator serves only processes of its own user (SO_PEERCRED) and says why it
refused the others. A real process of another user connects: the test runs as root,
forks, and the child drops to another uid before it connects (the interpreter under
/root is not readable by that user, so the child is a fork, not a new interpreter). The
directory and socket modes are opened up for the test only: 0700/0600 would stop the
peer before the coordinator sees it."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import warnings

import pytest

from flightgroup import JSON, FlightGroup

_NOBODY = 65534


def _connect_as(uid: int, path: str) -> bytes:
    """What a process of ``uid`` reads from ``path`` after its hello, until closed."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: see below
        pid = os.fork()
    if pid == 0:  # the child touches only os and socket: no lock another thread held
        code = 1
        try:
            os.close(read_end)
            os.setgid(uid)
            os.setuid(uid)
            peer = socket.socket(socket.AF_UNIX)
            peer.settimeout(10)
            peer.connect(path)
            # Refused on connect, before our hello: its answer is still queued.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                peer.sendall(b'{"protocol":"flightgroup","version":1}\n')
            try:
                while chunk := peer.recv(4096):
                    os.write(write_end, chunk)
            except ConnectionResetError:
                pass  # closed without reading our hello: the reset follows the answer
            code = 0
        except BaseException as error:  # shown by the parent's assertion
            os.write(write_end, repr(error).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 4096):
        data += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return data


@pytest.mark.skipif(os.getuid() != 0, reason="acting as another user needs root")
def test_a_peer_of_another_user_is_told_why_and_closed() -> None:
    base = tempfile.mkdtemp(prefix="fgu", dir="/tmp")
    directory = os.path.join(base, "d")
    group = FlightGroup(directory=directory, codec=JSON)
    try:
        assert group.run_sync("warm", lambda: 1).value == 1  # this group coordinates
        sock = os.path.join(directory, "flight.sock")
        assert os.stat(directory).st_mode & 0o777 == 0o700
        assert os.stat(sock).st_mode & 0o777 == 0o600
        os.chmod(base, 0o755)
        os.chmod(directory, 0o755)
        os.chmod(sock, 0o666)
        answer = _connect_as(_NOBODY, sock)
        assert answer == (
            b'{"ok":false,"error":"refused: uid %d is not the coordinator\'s user"}\n' % _NOBODY
        )
        # The coordinator goes on serving its own user.
        assert group.run_sync("after", lambda: 2).value == 2
    finally:
        group.close()
        shutil.rmtree(base, ignore_errors=True)
