"""Real processes for the directory-scope tests: a child driver and the parent's harness.

The child (``python -m tests.dirproc CONFIG_JSON``) opens
``FlightGroup(directory=..., codec=...)`` and obeys JSON-line commands on stdin,
answering JSON-line events on stdout:

commands (parent -> child)::

    {"cmd":"call","id":ID,"key":K,"work":SPEC,"mode":"sync"|"async",
     "timeout":S|null,"fresh":false,"group":"g0","on_join":true}
    {"cmd":"release","id":ID}          # lets a work with "block" go on
    {"cmd":"release_all"}              # ... every work with "block", now and later
    {"cmd":"open","group":NAME,"thread":bool}   # another group on the same directory
    {"cmd":"close","group":NAME}       # close a group (in a thread of its own)
    {"cmd":"forget","key":K,"group":NAME}   # answers {"ev":"forgot","key":K,"error":...}
    {"cmd":"unblock_log"}              # the thread held by "block_log" goes on
    {"cmd":"pid"}
    {"cmd":"exit"}

events (child -> parent)::

    {"ev":"ready","pid":P}
    {"ev":"log_blocked","message":M}        # a thread is held at a log record ("block_log")
    {"ev":"started","id":ID,"token":T}      # the work started (after its journal line)
    {"ev":"joined","id":ID}                 # on_join ran
    {"ev":"lost","id":ID,"lost":bool}       # wait_lost() returned inside the work
    {"ev":"returning","id":ID}              # the work is about to return or raise
    {"ev":"done","id":ID,"ok":true,"value":V,"joined":B,"token":T}
    {"ev":"done","id":ID,"ok":false,"error_type":S,"error_module":S,"message":S,
     "attrs":{...},"cause":{...}|null,"same_as_work_error":bool}

A work SPEC (a JSON object)::

    "journal": PATH     append "<pid> <key> <token>\\n" when the work starts
    "block": true       wait for {"cmd":"release","id":ID} before going on
    "block_first": true the same, in the first run of the call's work only (a retry
                        after a deadline runs beside it and goes on at once)
    "wait_lost": true   wait until the lease is lost (lease.wait_lost())
    and then one of:
    "return": V         return V (the default: return null)
    "return_chars": N   return a str of N characters
    "raise": MSG        raise ValueError(MSG)
    "raise_lease": true raise the lease's own error (lease.raise_if_lost())
    "unencodable": true return a set (JSON cannot encode it)
    "raise_times": N    (before the above) raise ValueError in the first N runs of the
                        call's work in this process (for retries)

CONFIG_JSON: ``directory`` (or ``redis`` and ``namespace``, with optional ``lease`` and
``cluster``: a fleet group); ``codec`` ("json", "pickle", or "test": JSON whose decode
fails for a str starting with ``!dec`` when ``fail_decode`` is true); optional
``reconnect_timeout``, ``max_value_bytes``, ``deadline``, ``keep_success`` (Retention),
``retry_attempts`` (Retry without backoff), ``keep_error``, ``keep_max_items``,
``keep_max_bytes`` (Retention), ``max_waiters`` (Limits); ``block_log`` (a text: the
first flightgroup log record that holds it stops the thread that logs it until
"unblock_log"); ``process_scope`` (a plain FlightGroup(),
only for checking this harness itself).

A large str value in a ``done`` event is reported as ``value_len`` and
``value_sha256`` instead of ``value``.

The parent side is :class:`Harness` (a temporary short directory, the children it
started, the journal) and :class:`Child`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import queue
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELLO = b'{"protocol":"flightgroup","version":1}\n'
HELLO_OK = b'{"ok":true}\n'
MAX_FRAME_BYTES = 64 * 1024 * 1024 + 64 * 1024
BIG_VALUE = 4096  # a str value longer than this is reported by length and digest

# -----------------------------------------------------------------------------
# the child
# -----------------------------------------------------------------------------


class DecodeFailure(Exception):
    """Raised by the test codec of a child configured with ``fail_decode``."""


class _TestCodec:
    """JSON, except that decoding a str value that starts with ``!dec`` fails."""

    def __init__(self, fail_decode: bool) -> None:
        self.fail_decode = fail_decode

    def encode(self, value: Any, /) -> bytes:
        return json.dumps(value).encode()

    def decode(self, data: bytes, /) -> Any:
        value = json.loads(data)
        if self.fail_decode and isinstance(value, str) and value.startswith("!dec"):
            raise DecodeFailure(f"this process cannot decode {value!r}")
        return value


class _ChildMain:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.out_lock = threading.Lock()
        self.releases: dict[Any, threading.Event] = {}
        self.releases_lock = threading.Lock()
        self.all_released = False
        self.work_errors: dict[Any, BaseException] = {}
        self.runs: dict[Any, int] = {}  # how many times each call's work ran here
        self.starts: dict[Any, int] = {}  # ... began here
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.loop_thread.start()
        self.groups: dict[str, Any] = {"g0": self.make_group()}
        self.log_free = threading.Event()
        if config.get("block_log"):
            self.hold_at_log(config["block_log"])

    # -- plumbing ---------------------------------------------------------------

    def emit(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, **fields}, default=repr) + "\n"
        with self.out_lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    def make_group(self) -> Any:
        import flightgroup

        cfg = self.config
        kind = cfg.get("codec", "json")
        if kind == "json":
            codec: Any = flightgroup.JSON
        elif kind == "pickle":
            codec = flightgroup.PICKLE
        else:
            codec = _TestCodec(bool(cfg.get("fail_decode")))
        if cfg.get("process_scope"):  # for the harness's own checks
            return flightgroup.FlightGroup()
        kwargs: dict[str, Any] = {}
        for name in ("reconnect_timeout", "max_value_bytes", "deadline"):
            if cfg.get(name) is not None:
                kwargs[name] = cfg[name]
        if cfg.get("retry_attempts") is not None:
            kwargs["retry"] = flightgroup.Retry(
                attempts=cfg["retry_attempts"], backoff=0.0, jitter=False
            )
        if cfg.get("keep_success") is not None or cfg.get("keep_error") is not None:
            kwargs["retention"] = flightgroup.Retention(
                success=cfg.get("keep_success"),
                error=cfg.get("keep_error"),
                max_items=cfg.get("keep_max_items", 10_000),
                max_bytes=cfg.get("keep_max_bytes"),
            )
        if cfg.get("max_waiters") is not None:
            kwargs["limits"] = flightgroup.Limits(max_waiters=cfg["max_waiters"])
        if cfg.get("takeover") is not None:
            kwargs["takeover"] = cfg["takeover"]
        if cfg.get("redis"):  # the fleet scope
            for name in ("lease", "cluster"):
                if cfg.get(name) is not None:
                    kwargs[name] = cfg[name]
            kwargs.pop("reconnect_timeout", None)
            return flightgroup.FlightGroup(
                redis=cfg["redis"], namespace=cfg["namespace"], codec=codec, **kwargs
            )
        return flightgroup.FlightGroup(directory=cfg["directory"], codec=codec, **kwargs)

    def hold_at_log(self, text: str) -> None:
        """The first flightgroup log record whose message holds ``text`` stops the
        thread that logs it (the group's own thread, for most) until "unblock_log":
        that thread does nothing meanwhile, while the process's other threads run."""
        import logging

        main = self
        held = threading.Event()

        class Hold(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if held.is_set() or text not in record.getMessage():
                    return
                held.set()
                main.emit("log_blocked", message=record.getMessage())
                main.log_free.wait()

        logger = logging.getLogger("flightgroup")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(Hold())

    def release_event(self, call_id: Any) -> threading.Event:
        with self.releases_lock:
            event = self.releases.setdefault(call_id, threading.Event())
            if self.all_released:
                event.set()
            return event

    def release_all(self) -> None:
        with self.releases_lock:
            self.all_released = True
            for event in self.releases.values():
                event.set()

    # -- the work ---------------------------------------------------------------

    def _blocks(self, call_id: Any, spec: dict[str, Any]) -> bool:
        """This run of the call's work waits for its release (counts its start)."""
        with self.releases_lock:
            starts = self.starts[call_id] = self.starts.get(call_id, 0) + 1
        return bool(spec.get("block")) or (bool(spec.get("block_first")) and starts == 1)

    def _begin(self, call_id: Any, key: str, spec: dict[str, Any]) -> Any:
        from flightgroup import current_lease

        lease = current_lease()
        if spec.get("journal"):
            fd = os.open(spec["journal"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, f"{os.getpid()} {key} {lease.token}\n".encode())
            finally:
                os.close(fd)
        self.emit("started", id=call_id, token=lease.token, key=key)
        return lease

    def _finish(self, call_id: Any, spec: dict[str, Any], lease: Any) -> Any:
        from flightgroup import LeaseLostError

        self.emit("returning", id=call_id)
        with self.releases_lock:
            runs = self.runs[call_id] = self.runs.get(call_id, 0) + 1
        if runs <= int(spec.get("raise_times", 0)):
            raise ValueError(f"attempt {runs} fails")
        if "raise" in spec:
            raise ValueError(spec["raise"])
        if spec.get("raise_lease"):
            try:
                lease.raise_if_lost()
            except LeaseLostError as error:
                self.work_errors[call_id] = error
                raise
            raise RuntimeError("raise_lease: the lease was not lost")
        if spec.get("unencodable"):
            return {1, 2, 3}
        if "return_chars" in spec:
            return "x" * int(spec["return_chars"])
        return spec.get("return")

    def sync_work(self, call_id: Any, key: str, spec: dict[str, Any]) -> Any:
        def work() -> Any:
            lease = self._begin(call_id, key, spec)
            if self._blocks(call_id, spec):
                self.release_event(call_id).wait()
            if spec.get("sleep"):
                time.sleep(float(spec["sleep"]))
            if spec.get("wait_lost"):
                asyncio.run(lease.wait_lost())
                self.emit("lost", id=call_id, lost=lease.lost)
            return self._finish(call_id, spec, lease)

        return work

    def async_work(self, call_id: Any, key: str, spec: dict[str, Any]) -> Any:
        async def work() -> Any:
            lease = self._begin(call_id, key, spec)
            if self._blocks(call_id, spec):
                event = self.release_event(call_id)
                loop = asyncio.get_running_loop()
                fut = loop.create_future()

                def waiter() -> None:
                    event.wait()
                    loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))

                threading.Thread(target=waiter, daemon=True).start()
                await fut
            if spec.get("sleep"):
                await asyncio.sleep(float(spec["sleep"]))
            if spec.get("wait_lost"):
                await lease.wait_lost()
                self.emit("lost", id=call_id, lost=lease.lost)
            return self._finish(call_id, spec, lease)

        return work

    # -- calls --------------------------------------------------------------------

    def report(self, call_id: Any, result: Any = None, error: BaseException | None = None) -> None:
        if error is None:
            fields: dict[str, Any] = {"ok": True, "joined": result.joined, "token": result.token}
            value = result.value
            if isinstance(value, str) and len(value) > BIG_VALUE:
                fields["value_len"] = len(value)
                fields["value_sha256"] = hashlib.sha256(value.encode()).hexdigest()
            else:
                fields["value"] = value
            self.emit("done", id=call_id, **fields)
            return
        attrs = {}
        for name in (
            "key", "error_type", "error_module", "message", "reason",
            "ours", "theirs", "size", "limit", "deadline",
        ):  # fmt: skip
            if hasattr(error, name):
                attrs[name] = getattr(error, name)
        cause = error.__cause__
        self.emit(
            "done",
            id=call_id,
            ok=False,
            error_type=type(error).__qualname__,
            error_module=type(error).__module__,
            message=str(error),
            attrs=attrs,
            cause=None
            if cause is None
            else {"type": type(cause).__qualname__, "message": str(cause)},
            same_as_work_error=self.work_errors.get(call_id) is error,
        )

    def call(self, cmd: dict[str, Any]) -> None:
        call_id = cmd["id"]
        key = cmd["key"]
        spec = cmd.get("work") or {}
        group = self.groups[cmd.get("group", "g0")]
        kwargs: dict[str, Any] = {
            "timeout": cmd.get("timeout"),
            "fresh": bool(cmd.get("fresh", False)),
        }
        if cmd.get("on_join", True):
            kwargs["on_join"] = lambda: self.emit("joined", id=call_id)
        if cmd.get("mode", "sync") == "async":

            async def run() -> None:
                try:
                    result = await group.run(key, self.async_work(call_id, key, spec), **kwargs)
                except BaseException as error:
                    self.report(call_id, error=error)
                else:
                    self.report(call_id, result)

            asyncio.run_coroutine_threadsafe(run(), self.loop)
            return

        def body() -> None:
            try:
                result = group.run_sync(key, self.sync_work(call_id, key, spec), **kwargs)
            except BaseException as error:
                self.report(call_id, error=error)
            else:
                self.report(call_id, result)

        threading.Thread(target=body, daemon=True, name=f"call-{call_id}").start()

    def open_group(self, cmd: dict[str, Any]) -> None:
        name = cmd["group"]
        if cmd.get("thread"):
            made: list[Any] = []
            thread = threading.Thread(target=lambda: made.append(self.make_group()))
            thread.start()
            thread.join()
            self.groups[name] = made[0]
        else:
            self.groups[name] = self.make_group()
        self.emit("opened", group=name)

    def close_group(self, cmd: dict[str, Any]) -> None:
        name = cmd.get("group", "g0")

        def body() -> None:
            try:
                self.groups[name].close()
            except BaseException as error:
                self.emit("closed", group=name, error=repr(error))
            else:
                self.emit("closed", group=name, error=None)

        threading.Thread(target=body, daemon=True).start()

    def forget(self, cmd: dict[str, Any]) -> None:
        group = self.groups[cmd.get("group", "g0")]

        def body() -> None:
            try:
                group.forget(cmd["key"])
            except BaseException as error:
                self.emit("forgot", key=cmd["key"], error=repr(error))
            else:
                self.emit("forgot", key=cmd["key"], error=None)

        threading.Thread(target=body, daemon=True).start()

    def serve(self) -> None:
        self.emit("ready", pid=os.getpid())
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            op = cmd["cmd"]
            if op == "call":
                self.call(cmd)
            elif op == "release":
                self.release_event(cmd["id"]).set()
            elif op == "release_all":
                self.release_all()
            elif op == "open":
                self.open_group(cmd)
            elif op == "close":
                self.close_group(cmd)
            elif op == "forget":
                self.forget(cmd)
            elif op == "unblock_log":
                self.log_free.set()
            elif op == "pid":
                self.emit("pid", pid=os.getpid())
            elif op == "exit":
                break
            else:
                self.emit("error", message=f"unknown command {op!r}")
        # stdin closed (the parent is gone) or exit: leave at once.
        sys.stdout.flush()
        os._exit(0)


def child_main(argv: list[str]) -> None:
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _ChildMain(json.loads(argv[1])).serve()


# -----------------------------------------------------------------------------
# the parent
# -----------------------------------------------------------------------------


class Child:
    """One child process and the events it printed (read by a thread of its own)."""

    def __init__(self, name: str, config: dict[str, Any], log_path: str) -> None:
        self.name = name
        self.config = config
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in close())
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [ROOT, os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")]
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.dirproc", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=ROOT,
            env=env,
        )
        self.pid = self.proc.pid
        self.events: list[dict[str, Any]] = []
        self._taken: set[int] = set()
        self._cond = threading.Condition()
        self.eof = False
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"read-{name}")
        self._reader.start()
        self.expect("ready", timeout=30)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                try:
                    event = json.loads(raw)
                except ValueError:
                    event = {"ev": "garbage", "line": raw.decode(errors="replace")}
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
        except ValueError:  # the pipe was closed by the harness as the child was stopped
            pass
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    # -- commands ---------------------------------------------------------------

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def call(
        self,
        call_id: str,
        key: str,
        work: dict[str, Any] | None = None,
        *,
        mode: str = "sync",
        **options: Any,
    ) -> None:
        self.send(cmd="call", id=call_id, key=key, work=work or {}, mode=mode, **options)

    def release(self, call_id: str) -> None:
        self.send(cmd="release", id=call_id)

    def roundtrip(self, call_id: str, key: str | None = None, value: Any = "ok") -> dict[str, Any]:
        """A quick call of a fresh key: proves this process is served right now."""
        self.call(call_id, key or f"rt-{self.name}-{call_id}", {"return": value})
        done = self.expect("done", call_id)
        assert done["ok"], (self.name, done)
        assert done["value"] == value
        return done

    def served_again(self, call_id: str, tries: int = 200) -> dict[str, Any]:
        """A roundtrip once this process hears a coordinator again: while it knows none
        answers (it gave up after reconnect_timeout), its calls are refused at once
        (ADR 0041) and it tries again, ``tries`` times at most, 50 ms apart."""
        for attempt in range(tries):
            name = f"{call_id}-{attempt}"
            self.call(name, f"rt-{self.name}-{name}", {"return": "ok"})
            done = self.expect("done", name)
            if done["ok"] or "has answered for" not in done.get("message", ""):
                assert done["ok"], (self.name, done)
                return done
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: no coordinator answered in {tries} tries")

    # -- events -----------------------------------------------------------------

    def _find(self, ev: str, call_id: Any) -> int | None:
        for index, event in enumerate(self.events):
            if index in self._taken or event.get("ev") != ev:
                continue
            if call_id is not None and event.get("id") != call_id:
                continue
            return index
        return None

    def expect(self, ev: str, call_id: Any = None, timeout: float = 20.0) -> dict[str, Any]:
        """The first event ``ev`` (of call ``call_id``) not taken yet; waits at most
        ``timeout`` seconds, then fails with what the child said."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                index = self._find(ev, call_id)
                if index is not None:
                    self._taken.add(index)
                    return self.events[index]
                left = end - time.monotonic()
                if left <= 0 or self.eof:
                    break
                self._cond.wait(left)
        self.dump_stacks()
        raise AssertionError(
            f"{self.name} (pid {self.pid}): no {ev!r} event for {call_id!r} within "
            f"{timeout} s (eof={self.eof}); events: {self.events[-20:]}\n"
            f"stderr:\n{self.stderr_tail()}"
        )

    def last(self, ev: str, call_id: Any = None) -> dict[str, Any]:
        """The latest event ``ev`` (of call ``call_id``), taken or not."""
        with self._cond:
            for event in reversed(self.events):
                if event.get("ev") == ev and (call_id is None or event.get("id") == call_id):
                    return event
        raise AssertionError(f"{self.name}: no {ev!r} event for {call_id!r}")

    def seen(self, ev: str, call_id: Any = None) -> bool:
        with self._cond:
            return any(
                e.get("ev") == ev and (call_id is None or e.get("id") == call_id)
                for e in self.events
            )

    def count(self, ev: str, call_id: Any = None) -> int:
        with self._cond:
            return sum(
                1
                for e in self.events
                if e.get("ev") == ev and (call_id is None or e.get("id") == call_id)
            )

    # -- signals ----------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.kill(self.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(20)

    def stop(self) -> None:
        """SIGSTOP, and return once every thread of the child is stopped."""
        os.kill(self.pid, signal.SIGSTOP)
        _, status = os.waitpid(self.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), (self.name, status)

    def cont(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def dump_stacks(self) -> None:
        """Ask the child for its threads' stacks (faulthandler, into its stderr)."""
        if self.alive() and not self._stopped():
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGUSR1)
                time.sleep(0.2)  # only to let faulthandler write before we read the log

    def _stopped(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
        except OSError:
            return False

    def stderr_tail(self, size: int = 6000) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            data = f.read()
            return data[-size:].decode(errors="replace")
        return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._reader.join(5)
        self._log.close()


class Harness:
    """A short temporary root (``/tmp/fgXXXX``) with the group directory ``d`` (not
    created: the first call creates it), a journal, the children's logs, and
    every child, lock and socket the test made, undone at exit."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="fg", dir="/tmp")
        self.dir = os.path.join(self.root, "d")
        self.journal_path = os.path.join(self.root, "journal")
        self.children: list[Child] = []
        self._fds: list[int] = []
        self._servers: list[FakeCoordinator] = []

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Kill (and reap) every child, close every lock and fake socket, print the
        children's stderr (pytest shows it for a failed test), remove the root."""
        for server in self._servers:
            server.close()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for child in self.children:
            child.close()
        for child in self.children:
            tail = child.stderr_tail()
            if tail.strip():
                print(f"--- stderr of {child.name} (pid {child.pid}) ---\n{tail}")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- children ---------------------------------------------------------------

    def spawn(self, name: str, *, directory: str | None = None, **config: Any) -> Child:
        """A child on this harness's directory, or (with ``redis=URL,
        namespace=NS``) a child of a fleet group."""
        if not config.get("redis"):
            config["directory"] = directory or self.dir
        child = Child(name, config, os.path.join(self.root, f"{name}.log"))
        self.children.append(child)
        return child

    def spawn_warm(self, name: str, **config: Any) -> Child:
        """A child that made one call already (so it takes part in the election)."""
        child = self.spawn(name, **config)
        child.roundtrip("warm")
        return child

    def work(self, **spec: Any) -> dict[str, Any]:
        """A work spec that writes to this harness's journal."""
        return {"journal": self.journal_path, **spec}

    # -- files ------------------------------------------------------------------

    def journal(self) -> list[tuple[int, str, int]]:
        try:
            with open(self.journal_path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            pid, key, token = line.split(" ")
            out.append((int(pid), key, int(token)))
        return out

    def runs_of(self, key: str) -> list[tuple[int, str, int]]:
        return [entry for entry in self.journal() if entry[1] == key]

    def epoch(self) -> int:
        with open(os.path.join(self.dir, "flight.epoch")) as f:
            return int(f.read())

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    def take_election(self) -> int:
        """Take the election lock (flight.lock) without waiting; fails if it is held.
        Call it only when no live child can take it (dead or stopped)."""
        fd = os.open(self.path("flight.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self._fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AssertionError(
                f"flight.lock is held: {lock_holders(self.path('flight.lock'))}"
            ) from None
        return fd

    def give_back_election(self, fd: int) -> None:
        self._fds.remove(fd)
        os.close(fd)

    def fake_coordinator(self, answer: bytes) -> FakeCoordinator:
        server = FakeCoordinator(self.path("flight.sock"), answer)
        self._servers.append(server)
        return server

    def coordinator_pid(self, not_pid: int | None = None, timeout: float = 20.0) -> int:
        """The pid of the process serving flight.sock (its SO_PEERCRED), waiting until one
        other than ``not_pid`` serves."""
        end = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < end:
            try:
                pid = peer_pid(self.path("flight.sock"))
            except OSError as error:
                last = error
            else:
                if pid != not_pid:
                    return pid
                last = f"still {pid}"
            threading.Event().wait(0.01)  # polling for a state other processes reach
        raise AssertionError(f"no coordinator (other than {not_pid}) serves: {last}")

    def flights(self) -> list[dict[str, Any]]:
        """The flights in progress, asked of whoever coordinates now (a raw connection)."""
        with RawConn(self.path("flight.sock")) as conn:
            assert conn.hello() == HELLO_OK
            conn.send_frame({"op": "status", "id": 1})
            header, _ = conn.read_frame()
            assert header["op"] == "status", header
            return list(header["flights"])

    def led_by(self, key: str, pid: int) -> bool:
        """Whether the coordinator now knows a flight of ``key`` led by process ``pid``."""
        return any(f["key"] == key and f["leader_pid"] == pid for f in self.flights())


def peer_pid(sock_path: str) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(sock_path)
        cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, _, _ = struct.unpack("3i", cred)
        return int(pid)


def lock_holders(path: str) -> list[str]:
    """The /proc/locks lines of the file at ``path`` (for failure messages)."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError as error:
        return [repr(error)]
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[5].rsplit(":", 1)[-1] == str(st.st_ino):
            out.append(line)
    return out


def key_file(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# -----------------------------------------------------------------------------
# raw sockets
# -----------------------------------------------------------------------------


@contextlib.contextmanager
def raw_conns(path: str, count: int) -> Iterator[list[RawConn]]:
    """``count`` raw connections to the coordinator's socket ``path``, each past the
    handshake (served); closed at the end."""
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(RawConn(path)) for _ in range(count)]
        for conn in conns:
            assert conn.hello() == HELLO_OK
        yield conns


class RawConn:
    """A raw client connection to flight.sock, for bad-input tests."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.buf = b""

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def hello(self, line: bytes = HELLO) -> bytes:
        self.send(line)
        return self.read_line()

    def read_line(self, timeout: float = 10.0) -> bytes:
        while b"\n" not in self.buf:
            chunk = self._recv(timeout)
            if not chunk:
                raise EOFError(f"closed before a line; got {self.buf!r}")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"

    def _recv(self, timeout: float) -> bytes:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            raise TimeoutError(f"nothing to read within {timeout} s")
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""

    def send_frame(self, header: dict[str, Any] | bytes, payload: bytes | None = None) -> None:
        body = header if isinstance(header, bytes) else json.dumps(header).encode()
        if payload is not None:
            body += b"\n" + payload
        self.send(struct.pack(">I", len(body)) + body)

    def read_frame(self, timeout: float = 10.0) -> tuple[dict[str, Any], bytes]:
        while len(self.buf) < 4:
            chunk = self._recv(timeout)
            if not chunk:
                raise EOFError(f"closed before a frame; got {self.buf!r}")
            self.buf += chunk
        (size,) = struct.unpack(">I", self.buf[:4])
        while len(self.buf) < 4 + size:
            chunk = self._recv(timeout)
            if not chunk:
                raise EOFError("closed inside a frame")
            self.buf += chunk
        body, self.buf = self.buf[4 : 4 + size], self.buf[4 + size :]
        header, _, payload = body.partition(b"\n")
        return json.loads(header), payload

    def expect(self, op: str, timeout: float = 10.0) -> tuple[dict[str, Any], bytes]:
        """The next frame, which must be an ``op``."""
        header, payload = self.read_frame(timeout)
        assert header["op"] == op, header
        return header, payload

    def served(self) -> None:
        """Every frame sent on this connection before was served (frames go in order;
        a status is answered at once, never waits)."""
        self.send_frame({"op": "status", "id": 999})
        self.expect("status")

    def closed_by_peer(self, timeout: float = 10.0) -> bytes:
        """Read until the peer closes; returns what came before. Fails if the peer
        keeps the connection open past ``timeout``."""
        data = b""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the connection stayed open; got {data!r}")
            try:
                chunk = self._recv(left)
            except TimeoutError:
                raise AssertionError(f"the connection stayed open; got {data!r}") from None
            except OSError as error:
                if error.errno in (errno.ECONNRESET, errno.EPIPE):
                    return self.buf + data
                raise
            if not chunk:
                return self.buf + data
            data += chunk


class FakeCoordinator:
    """Serves flight.sock (the test holds flight.lock), answering every hello with
    ``answer`` and closing. Records each hello line it read."""

    def __init__(self, path: str, answer: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.answer = answer
        self.hellos: queue.Queue[bytes] = queue.Queue()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(16)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if not ready:
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                with contextlib.suppress(OSError):
                    while b"\n" not in data and len(data) < 4096:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    self.hellos.put(data)
                    conn.sendall(self.answer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


class MuteCoordinator:
    """Serves flight.sock (the test holds flight.lock) and answers nothing but the
    handshake: the test reads what a group sends, and answers by hand if it wants."""

    def __init__(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(16)
        self.conns: list[RawConn] = []

    def accept(self, timeout: float = 10.0) -> RawConn:
        """The next connection, its handshake answered."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        assert ready, "no group connected"
        sock, _ = self.sock.accept()
        sock.settimeout(10)
        conn = RawConn.__new__(RawConn)
        conn.sock, conn.buf = sock, b""
        self.conns.append(conn)
        assert json.loads(conn.read_line(timeout))["protocol"] == "flightgroup"
        conn.send(HELLO_OK)
        return conn

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.sock.close()


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Wait (bounded) until ``predicate()`` holds: for a state other processes reach."""
    end = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        pause.wait(0.005)


def wait_any(children: list[Child], ev: str, call_id: Any, timeout: float = 20.0) -> Child:
    """The first of ``children`` that printed ``ev`` for ``call_id`` (the event is not
    taken)."""
    end = time.monotonic() + timeout
    pause = threading.Event()
    while time.monotonic() < end:
        for child in children:
            if child.seen(ev, call_id):
                return child
        pause.wait(0.005)  # polling for a state the children reach
    raise AssertionError(f"none of {[c.name for c in children]} printed {ev!r} for {call_id!r}")


def key_lock_held(h: Harness, key: str) -> bool:
    """Whether some process holds the key lock of ``key`` (probed with LOCK_NB; a free
    lock is given back at once)."""
    fd = os.open(h.path("execution-locks", key_file(key)), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def assert_value(done: dict[str, Any], value: Any, joined: bool) -> None:
    assert done["ok"], done
    assert done["joined"] is joined, done
    if "value_len" in done:
        assert isinstance(value, str), done
        assert done["value_len"] == len(value), done
        assert done["value_sha256"] == hashlib.sha256(value.encode()).hexdigest(), done
    else:
        assert done["value"] == value, done


def assert_error(done: dict[str, Any], error_type: str) -> dict[str, Any]:
    """The call failed with ``error_type``; returns the error's attributes."""
    assert not done["ok"], done
    assert done["error_type"] == error_type, done
    return dict(done["attrs"])


@contextlib.contextmanager
def harness() -> Iterator[Harness]:
    h = Harness()
    try:
        yield h
    finally:
        h.cleanup()


# A child program that coordinates ``sys.argv[1]`` until it is killed.
COORDINATOR_PROGRAM = r"""
import sys, threading
from flightgroup import JSON, FlightGroup
group = FlightGroup(directory=sys.argv[1], codec=JSON)
group.run_sync("warm", lambda: 0)
print("coordinating", flush=True)
threading.Event().wait()
"""


def frames_until(conn: Any, op: str, key: str) -> dict[str, Any]:
    """Read frames until an ``op`` of ``key`` (a reconnect resends every open call)."""
    while True:
        header, _ = conn.read_frame()
        if header["op"] == op and header.get("key") == key:
            return header


def acknowledge_landing(conn: Any, id: int) -> dict[str, Any]:
    """Read frames until the ``land`` of lead ``id``, and acknowledge it as a coordinator
    does (the leader's call returns once its landing is taken); returns its header."""
    while True:
        header, _ = conn.read_frame()
        if header["op"] == "land" and header["id"] == id:
            conn.send_frame({"op": "ack", "id": id})
            return header


if __name__ == "__main__":
    child_main(sys.argv)


def herd_takes_over_a_killed_leader(h: Harness, children: list[Child], callers: int) -> None:
    """``callers`` calls of one key in each of ``children`` (groups with ``takeover``):
    the first child's first call leads and its work blocks; every other call joins it
    (half sync, half async). The leader's process is SIGKILLed: no caller of the other
    processes fails, they all get the value of one takeover run, and the work ran
    exactly twice (the killed run and that one), the second under a greater token."""
    leader, *others = children
    leader.call("l", "k", h.work(block=True, **{"return": "never"}))
    started = leader.expect("started", "l")
    # The takeover's work lasts long enough for every process to hear the leader died
    # before it ends (a later one would lead another run).
    takeover = h.work(sleep=1.5, **{"return": "taken over"})
    ids = [f"j{i}" for i in range(callers)]
    for child in children:
        for i, call_id in enumerate(ids):
            if child is leader and i == 0:
                continue
            child.call(call_id, "k", takeover, mode="async" if i % 2 else "sync")
    for child in children:
        for i, call_id in enumerate(ids):
            if not (child is leader and i == 0):
                child.expect("joined", call_id)
    leader.kill()
    tokens = set()
    for child in others:
        for call_id in ids:
            done = child.expect("done", call_id, timeout=30)
            assert done.get("ok") and done["value"] == "taken over", (child.name, done)
            tokens.add(done["token"])
    runs = h.runs_of("k")
    assert len(runs) == 2 and runs[0] == (leader.pid, "k", started["token"]), runs
    assert runs[1][0] in {child.pid for child in others}
    assert tokens == {runs[1][2]} and runs[1][2] > started["token"], (tokens, runs)
