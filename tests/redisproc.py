"""Real Redis servers for the fleet-scope tests, started and stopped by pid.

- :class:`RedisServer`: one ``redis-server`` on a free loopback port, keeping nothing
  on disk (``--save '' --appendonly no``), that a test may SIGKILL, SIGSTOP or restart
  on the same port (empty: a restart without persistence).
- :class:`RedisCluster`: three such servers as a 3-master Redis Cluster
  (``--cluster-enabled yes`` + ``redis-cli --cluster create``).
- :class:`CutProxy`: a TCP proxy in front of a server that, once armed, forwards one
  command whose bytes contain a marker, lets the server answer, and then cuts the
  client's connection without passing the answer on: the client sees a dropped
  reply after the server acted, and redis-py re-sends the command.
- :class:`HoldingCutProxy`: a CutProxy that also holds back the connections opened
  after ``arm`` (the one redis-py re-sends on) until ``release()``: the test acts on
  the server between the first send and the re-send.
- :func:`keys_without_ttl`: every key of a namespace that has no TTL.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis

# Another server build (a Valkey, an older Redis) can be put under the whole suite:
# FLIGHTGROUP_TEST_REDIS_SERVER and FLIGHTGROUP_TEST_REDIS_CLI name its binaries.
REDIS_SERVER = os.environ.get("FLIGHTGROUP_TEST_REDIS_SERVER") or (
    shutil.which("redis-server") or "/usr/bin/redis-server"
)
REDIS_CLI = os.environ.get("FLIGHTGROUP_TEST_REDIS_CLI") or (
    shutil.which("redis-cli") or "/usr/bin/redis-cli"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port where every connection is refused while the block runs: a socket
    holds it bound and never listens, so no server that another test starts meanwhile
    can take it (a ``free_port()`` is free only when it is asked for)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port: int = held.getsockname()[1]
        yield port


def free_cluster_port() -> int:
    """A free port for a Cluster node: at most 55535 (its cluster bus listens on
    port + 10000) with port + 10000 free too."""
    for _ in range(200):
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisServer:
    """One redis-server process on 127.0.0.1 (see the module)."""

    def __init__(self, port: int | None = None, *extra: str) -> None:
        self.port = port or free_port()
        self._port_given = port is not None  # a restart keeps it; a new server may move
        self.dir = tempfile.mkdtemp(prefix="fgredis")
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self.start()
        except BaseException:
            self.close()  # no process or folder left behind
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (again) on the same port, empty. A port chosen here that another
        process took before the server bound it (another test run on this host) is
        replaced by a new free one; a given port, or a restart's, is not."""
        for _ in range(5):
            if self._start_once():
                self._port_given = True  # from now on, clients hold this port
                return
            if self._port_given:
                break
            self.port = free_port()
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def _start_once(self) -> bool:
        """Start on ``self.port``; True once it answers, and it is this process that
        answers (a ping alone may reach another run's server on a reused port)."""
        log = open(os.path.join(self.dir, "redis.log"), "ab")  # noqa: SIM115
        proc = self.proc = subprocess.Popen(
            [
                REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.dir,
                "--protected-mode", "no", *self.extra,
            ],
            stdout=log, stderr=log, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                owner = self.client().info("server")["process_id"]
            except redis.ConnectionError:
                time.sleep(0.02)
                continue
            if owner == proc.pid:
                return True
            break  # another server holds the port: ours cannot bind it
        self.kill()
        return False

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the server and reap it: everything it held is gone."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        """Kill, then start empty on the same port (a restart without persistence)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """Three masters on free loopback ports, one cluster (no replicas)."""

    def __init__(self) -> None:
        self.servers: list[RedisServer] = []
        try:
            for _ in range(3):
                port = free_cluster_port()
                self.servers.append(RedisServer(
                    port, "--cluster-enabled", "yes",
                    "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-node-timeout", "5000",
                ))
            subprocess.run(
                [REDIS_CLI, "--cluster", "create",
                 *(f"127.0.0.1:{s.port}" for s in self.servers),
                 "--cluster-replicas", "0", "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )
            deadline = time.monotonic() + 30
            while not all(
                b"cluster_state:ok" in s.client().execute_command("CLUSTER", "INFO")
                for s in self.servers
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not come up")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return self.servers[0].url

    def close(self) -> None:
        for server in self.servers:
            server.close()


class CutProxy:
    """A TCP proxy to ``target_port`` (see the module). ``arm(marker)`` cuts the
    reply to the next command containing ``marker``; ``cuts`` counts the cuts."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self.cuts = 0
        self._closed = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def arm(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    def _take_marker(self, data: bytes) -> bool:
        with self._lock:
            if self._marker is not None and self._marker in data:
                self._marker = None
                return True
            return False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        """Connect ``client`` to the server and pass their bytes (this thread)."""
        server = socket.create_connection(("127.0.0.1", self.target_port))
        self._socks += [client, server]
        self._pump(client, server)

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        cut_after_reply = False
        try:
            while True:
                ready, _, _ = select.select([client, server], [], [], 1.0)
                if self._closed:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        if self._take_marker(data):
                            cut_after_reply = True
                        server.sendall(data)
                    elif cut_after_reply:
                        # The server acted and answered: drop the answer, cut the client.
                        with self._lock:
                            self.cuts += 1
                        return
                    else:
                        client.sendall(data)
        except (OSError, ValueError):  # (ValueError: close() closed a socket meanwhile)
            return
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.close()


class HoldingCutProxy(CutProxy):
    """A :class:`CutProxy` whose connections opened after ``arm`` wait at the proxy
    (not yet connected to the server) until ``release()``; ``held`` is set when one
    waits: after a cut, that is the client's re-send, sent and not yet passed on."""

    def __init__(self, target_port: int) -> None:
        self._gate = threading.Event()
        self._gate.set()
        self.held = threading.Event()
        super().__init__(target_port)

    def arm(self, marker: bytes) -> None:
        self._gate.clear()
        super().arm(marker)

    def release(self) -> None:
        self._gate.set()

    def close(self) -> None:
        self._gate.set()
        super().close()

    def _open(self, client: socket.socket) -> None:
        if not self._gate.is_set():
            self.held.set()
            self._gate.wait()
        if self._closed:
            client.close()
            return
        super()._open(client)


def keys_without_ttl(client: Any, pattern: str = "fg:*") -> list[bytes]:
    """The keys matching ``pattern`` that have no TTL (TTL -1)."""
    return [name for name in client.scan_iter(match=pattern, count=1000) if client.ttl(name) == -1]
