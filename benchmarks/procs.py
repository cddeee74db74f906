"""Worker processes for the benchmarks that span processes (directory, fleet): each is
driven over a pipe with (command, *args) and answers ("ok", value) or ("error", text)."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

__all__ = ["WAIT", "Proc", "context", "gather", "serve"]

WAIT = 120.0  # seconds a command may take before the run gives up on a worker


def context(preload: Sequence[str] = ()) -> BaseContext:
    """The forkserver context (each worker forks from a server that imported
    ``preload`` once), or spawn where there is none."""
    try:
        ctx = multiprocessing.get_context("forkserver")
    except ValueError:
        return multiprocessing.get_context("spawn")
    if preload:
        ctx.set_forkserver_preload(list(preload))
    return ctx


class Proc:
    """A worker process running ``target(conn, *args)`` and its pipe."""

    def __init__(self, ctx: BaseContext, target: Callable[..., None], *args: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(  # type: ignore[attr-defined]
            target=target, args=(child, *args), daemon=True
        )
        self.process.start()
        child.close()

    @property
    def pid(self) -> int:
        pid: int = self.process.pid
        return pid

    def send(self, command: str, *args: Any) -> None:
        self.conn.send((command, *args))

    def recv(self) -> Any:
        if not self.conn.poll(WAIT):
            raise TimeoutError(f"worker {self.pid} did not answer in {WAIT:g} s")
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"worker {self.pid}: {value}")
        return value

    def ask(self, command: str, *args: Any) -> Any:
        self.send(command, *args)
        return self.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self.send("exit")
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()  # by its pid
            self.process.join(10)
        self.conn.close()


def gather(procs: Sequence[Proc], command: str, *args: Any) -> list[Any]:
    """Send ``command`` to every worker, then collect their answers in order."""
    for proc in procs:
        proc.send(command, *args)
    return [proc.recv() for proc in procs]


def serve(conn: Connection, worker: Any) -> None:
    """A worker process's loop: run ``worker.<command>(*args)`` for each command on
    ``conn`` and answer, until "exit" or the parent is gone; then ``worker.close()``."""
    try:
        while True:
            try:
                command, *args = conn.recv()
            except EOFError:
                return
            if command == "exit":
                return
            try:
                conn.send(("ok", getattr(worker, command)(*args)))
            except Exception as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        worker.close()
        conn.close()
