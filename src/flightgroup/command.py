"""``flightgroup run``: run a command as the leader of a key, or join its run.

The leader's work starts CMD (stdin inherited), passes its stdout and stderr
through live and records them (see ``command_spool``); its value says how CMD
ended. A joiner says that it joined, follows the leader's spool while it waits
(directory scope) or prints the output carried by the value at the end (fleet
scope), and exits with the leader's exit code.

Signals: SIGINT to a joiner withdraws it (exit 130, the run goes on); SIGINT and
SIGTERM to the leader go to CMD, and the flight ends with CMD's own exit status.
"""

from __future__ import annotations

import errno
import math
import os
import select
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

from .codec import JSON
from .command_spool import (
    STDERR,
    STDOUT,
    Capture,
    RecordReader,
    SpoolWriter,
    decode_records,
    prune_spools,
    spool_path,
)
from .directory import fs
from .errors import FlightError, FlightFailedError, FlightInterruptedError
from .group import FlightGroup, internals
from .lease import current_lease

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_SIGINT",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "Scope",
    "UsageError",
    "default_directory",
    "open_group",
    "run_command",
]

EXIT_USAGE = 2
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: the leader died; running again may work
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_SIGINT = 130  # 128 + SIGINT, as a shell reports it
EXIT_SIGPIPE = 128 + signal.SIGPIPE  # 141, as a shell reports a command SIGPIPE killed
EXIT_CANNOT_RUN = 126  # as a shell: found but not runnable
EXIT_NOT_FOUND = 127

_POLL = 0.03  # seconds between two looks at a spool's growth
_PROGRESS_EVERY = 0.1
_FLEET_DEFAULT_MAX_VALUE = 1024 * 1024
_VALUE_ROOM = 4096  # the value's other fields and JSON's quoting, beside the output


class UsageError(Exception):
    """Bad usage: the command exits 2 with this one line."""


@dataclass(frozen=True)
class Scope:
    """Where the group lives: a directory, or a Redis URL and a namespace."""

    directory: str | None = None
    redis: str | None = None
    namespace: str | None = None
    default: bool = False  # the directory is the default one (not named by --dir)


def default_directory() -> str:
    """``$XDG_RUNTIME_DIR/flightgroup``, else ``flightgroup-<uid>`` in the temp dir."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "flightgroup")
    return os.path.join(tempfile.gettempdir(), f"flightgroup-{os.getuid()}")


def scope_from_args(directory: str | None, redis: str | None, namespace: str | None) -> Scope:
    """Check the scope options of ``run`` and ``status``; UsageError if they clash."""
    if redis is not None:
        if directory is not None:
            raise UsageError("--dir and --redis exclude each other: choose one scope")
        if not namespace:
            raise UsageError("--redis needs --namespace NS (a non-empty namespace)")
        return Scope(redis=redis, namespace=namespace)
    if namespace is not None:
        raise UsageError("--namespace belongs to --redis")
    if directory is not None:
        if not directory:
            raise UsageError("--dir must not be empty")
        # Absolute: the value names the spool for joiners that run in other folders.
        return Scope(directory=os.path.abspath(directory))
    return Scope(directory=default_directory(), default=True)


def _check_default_folder(path: str, create: bool) -> bool:
    """Make the default folder 0700 if asked; refuse one that another user could
    have planted (the temp dir is shared). False if it does not exist."""
    if create:
        try:
            os.makedirs(path, mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise UsageError(f"cannot create the default folder {path}: {exc.strerror}") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise UsageError(
            f"the default directory {path} is not a folder of yours that only you can "
            "write; remove it or pass --dir"
        )
    return True


def open_group(scope: Scope, *, create: bool = True) -> FlightGroup | None:
    """The group of ``scope``; None for a default directory that does not exist and
    ``create`` is false (``status`` creates nothing). Raises UsageError."""
    try:
        if scope.redis is not None:
            return FlightGroup(redis=scope.redis, namespace=scope.namespace, codec=JSON)
        assert scope.directory is not None
        if scope.default and not _check_default_folder(scope.directory, create):
            return None
        if not create and os.path.exists(scope.directory):
            if not os.path.isdir(scope.directory):
                raise UsageError(f"cannot use the directory {scope.directory}: not a directory")
            fs.check_local(scope.directory)  # a network file system: bad usage, as for run
        if not create and not os.path.exists(os.path.join(scope.directory, fs.LOCK_NAME)):
            # No group ever used it (or it is no directory): nothing to ask, and a
            # status must not leave a group's files in any folder it is pointed at.
            return None
        # The group checks the path (its socket's length) and creates nothing: bad
        # usage changes nothing on disk.
        group = FlightGroup(directory=scope.directory, codec=JSON)
        if create:
            # A path that cannot be a directory group (a file, /proc, no permission)
            # is bad usage: one line, exit 2, not the first call's traceback.
            try:
                fs.ensure_directory(scope.directory)
            except OSError as exc:
                group.close()
                cause = exc.__cause__
                reason = (
                    fs.why_not_created(scope.directory, cause)[1]
                    if isinstance(cause, OSError)
                    else exc.strerror or str(exc)
                )
                raise UsageError(f"cannot use the directory {scope.directory}: {reason}") from None
        return group
    except NotImplementedError:
        raise UsageError("the fleet scope is not available in this version") from None
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None


def parse_timeout(text: str | None) -> float | None:
    """``--timeout``: positive, finite seconds."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {text!r}")
    return seconds


# Our stdout and stderr among fds 1 and 2 that were closed when we started: /dev/null
# holds their place (hold_standard_fds), and CMD's output for them is recorded, not passed.
_closed_at_start: frozenset[int] = frozenset()


def hold_standard_fds() -> None:
    """Put /dev/null on each of fds 0, 1 and 2 that is closed (``>&-``), before anything
    opens a descriptor: else the group's own (its event loop's epoll, a socket) would
    take that number, and what is written to "stdout" would go into it."""
    global _closed_at_start
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)  # CMD gets it too (os.open's are close-on-exec)
    _closed_at_start = frozenset(closed)


def _write_all(fd: int, data: bytes) -> OSError | None:
    """Write ``data`` to ``fd``; None, or the error that stopped it (EPIPE: the reader
    went away). A full descriptor left non-blocking by whoever made it (EAGAIN) is
    waited for, as a blocking one would be."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])
        except OSError as exc:
            return exc
    return None


def _failed_to_pass(error: OSError, own: int, whose: str) -> bool:
    """After writing to our ``own`` fd failed with ``error``: True (said once, on
    stderr) for a real write error, False when our reader went away (EPIPE)."""
    if error.errno == errno.EPIPE:
        return False
    name = "stdout" if own == 1 else "stderr"
    _say(f"cannot write the {whose} {name}: {error.strerror or error}")
    return True


def _say(line: str) -> None:
    # To the descriptor itself: with fd 2 closed (`2>&-`) sys.stderr is None, and a
    # joiner must still pass on the leader's output and exit code.
    _write_all(2, f"flightgroup: {line}\n".encode(errors="replace"))


def _exit_status(returncode: int) -> int:
    """A shell's view: killed by signal N is 128+N."""
    return returncode if returncode >= 0 else 128 - returncode


def _terminal_sent_sigint() -> bool:
    """Whether a SIGINT most likely came from our terminal's Ctrl-C: we are in its
    foreground process group, and so is CMD (it shares our group), so the kernel
    gave CMD the same SIGINT and forwarding it would make a second one."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False  # no controlling terminal
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


class _Follower:
    """A joiner's view of the leader's output: follows the spool file while it
    grows, and shows a progress line on a terminal until output comes."""

    def __init__(
        self,
        key: str,
        path: str | None,
        age: float,
        leader: str,
        reader_gone: Callable[[], None] | None = None,
    ) -> None:
        self._key = key
        self._on_reader_gone = reader_gone  # called from the follow thread
        self._path = path
        self._fd = -1
        self._reader = RecordReader()
        self._started = time.monotonic() - age
        self._leader = leader
        self._tty = os.isatty(2)
        self._progress = False  # the progress line is on the screen
        self._next_progress = 0.0
        self._not_passed: set[int] = set(_closed_at_start)  # our fds that take no more
        # Our reader went away (EPIPE): the joiner withdraws and exits 141 quietly.
        self.reader_gone = False
        # Another write error (ENOSPC, EIO): said; exit 1 if the leader's CMD succeeded.
        self.write_failed = False
        self.emitted = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Follow in a background thread (only when there is something to do)."""
        if self._path is None and not self._tty:
            return
        self._thread = threading.Thread(target=self._run, name="flightgroup-follow", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._poll()
            self._show_progress()
            if self._stop.wait(_POLL):
                return

    def _poll(self) -> None:
        if self._fd < 0:
            if self._path is None:
                return
            try:
                self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return  # not created yet
        while True:
            data = os.read(self._fd, 1 << 16)
            if not data:
                return
            self.emit(self._reader.feed(data))

    def emit(self, records: list[tuple[int, bytes]]) -> None:
        """Write records to our stdout and stderr."""
        for stream, data in records:
            if not data:
                continue
            self._clear_progress()
            self.emitted = True
            own = 1 if stream == STDOUT else 2
            if own in self._not_passed:
                continue
            error = _write_all(own, data)
            if error is None:
                continue
            self._not_passed.add(own)
            if _failed_to_pass(error, own, "leader's"):
                self.write_failed = True
                continue
            # As in a pipeline (`| head -1`): this caller is done (see
            # _Run.withdraw_now); at the end of the run, it just exits 141.
            self.reader_gone = True
            if self._on_reader_gone and threading.current_thread() is self._thread:
                self._on_reader_gone()

    def _show_progress(self) -> None:
        now = time.monotonic()
        if not self._tty or self.emitted or now < self._next_progress:
            return
        self._next_progress = now + _PROGRESS_EVERY
        elapsed = now - self._started
        line = f"\rflightgroup: waiting for {self._key!r}{self._leader}: {elapsed:.1f} s\x1b[K"
        _write_all(2, line.encode(errors="replace"))
        self._progress = True

    def _clear_progress(self) -> None:
        if self._progress:
            _write_all(2, b"\r\x1b[K")
            self._progress = False

    def stop(self) -> None:
        """Stop following (the thread ends within one poll)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finish(self, path: str | None) -> None:
        """After the flight: stop, then write what is left. ``path`` is the spool the
        value names: read from it if this joiner never found its spool."""
        self.stop()
        if path is not None and path != self._path:
            if self.emitted:  # a newer flight of the key started before our status look
                self._clear_progress()
                _say(f"the output above may be another run's of {self._key!r} than this one")
            else:
                self._close_fd()
                self._path, self._reader = path, RecordReader()
        self._poll()
        self._clear_progress()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def abandon(self) -> None:
        """Stop without reading further (this caller withdrew)."""
        self.stop()
        self._clear_progress()
        self._close_fd()


class _Run:
    """One ``flightgroup run``: the leader's work and the joiner's side."""

    leader_unknown = False  # the join line could not name the leader (set in on_join)

    def __init__(self, group: FlightGroup, scope: Scope, key: str, cmd: Sequence[str]) -> None:
        self.group = group
        self.scope = scope
        self.key = key
        self.cmd = list(cmd)
        self.leading = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []  # signals that came before CMD started
        # Reentrant: the SIGINT handler runs on the main thread, which may hold it.
        self.lock = threading.RLock()
        self.done = threading.Event()
        self.value: dict[str, Any] | None = None
        self.work_thread: threading.Thread | None = None
        self.follower: _Follower | None = None
        # Writing CMD's output to our own stdout or stderr failed (ENOSPC, EIO, ...):
        # the leader says so and exits 1 if CMD succeeded; its joiners are not affected.
        self.write_failed = False
        # on_signal is SIGINT's handler (the main thread runs the call): a joiner whose
        # reader went away may withdraw by sending it SIGINT.
        self.handles_sigint = False

    # -- signals ---------------------------------------------------------------

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT/SIGTERM: the leader forwards them to CMD; a joiner withdraws."""
        if not self.leading:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)  # die of it, as without a handler
            os.kill(os.getpid(), signum)
            return
        if signum == signal.SIGINT and _terminal_sent_sigint():
            return
        with self.lock:
            proc = self.proc
            if proc is None:
                self.pending.append(signum)
                return
        proc.send_signal(signum)

    # -- the leader --------------------------------------------------------------

    def work(self) -> dict[str, Any]:
        """The flight's work (in the leader): run CMD, pass its output through,
        record it; the value says how it ended."""
        self.leading = True
        self.work_thread = threading.current_thread()
        try:
            token = current_lease().token
            sink: SpoolWriter | Capture
            value: dict[str, Any] = {
                "exit": 0,
                "spool": None,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "token": token,
            }
            if self.scope.directory is not None:
                # The new spool makes KEEP_SPOOLS again.
                prune_spools(self.scope.directory, self.key, keep=2)
                sink = SpoolWriter(spool_path(self.scope.directory, self.key, token))
                value["spool"] = sink.path
            else:
                limit = internals(self.group).max_value_bytes or _FLEET_DEFAULT_MAX_VALUE
                sink = Capture((limit - _VALUE_ROOM) * 3 // 4)  # base64 grows it by 4/3
            try:
                value["exit"] = self._execute(sink)
            finally:
                if isinstance(sink, SpoolWriter):
                    sink.close()
            if isinstance(sink, Capture):
                value["output"] = sink.encode()
                value["dropped"] = sink.dropped
            self.value = value
            return value
        finally:
            self.done.set()

    def _execute(self, sink: SpoolWriter | Capture) -> int:
        try:
            proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            message = f"flightgroup: cannot run {self.cmd[0]!r}: {exc.strerror or exc}\n"
            data = message.encode(errors="replace")
            _write_all(2, data)
            sink.write(STDERR, data)
            return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_RUN
        with self.lock:
            self.proc = proc
            pending, self.pending = self.pending, []
        for signum in pending:
            proc.send_signal(signum)
        assert proc.stdout is not None
        assert proc.stderr is not None
        pumps = [
            threading.Thread(
                target=self._pump,
                args=(pipe, own, stream, sink),
                name="flightgroup-pump",
                daemon=True,
            )
            for pipe, own, stream in ((proc.stdout, 1, STDOUT), (proc.stderr, 2, STDERR))
        ]
        for pump in pumps:
            pump.start()
        returncode = proc.wait()
        # The pipes end when every process holding them does (CMD's children too).
        for pump in pumps:
            pump.join()
        proc.stdout.close()
        proc.stderr.close()
        return _exit_status(returncode)

    def _pump(self, pipe: IO[bytes], own: int, stream: int, sink: SpoolWriter | Capture) -> None:
        """Copy one of CMD's pipes to our own fd (live) and to the sink."""
        fd = pipe.fileno()
        passing = own not in _closed_at_start  # closed by our caller: nothing to pass
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except InterruptedError:  # pragma: no cover  (PEP 475 retries)
                continue
            if not data:
                return
            sink.write(stream, data)
            if not passing:
                continue
            error = _write_all(own, data)
            if error is None:
                continue
            passing = False
            if _failed_to_pass(error, own, "command's"):
                self.write_failed = True
                continue
            # Our reader went away (`| head -1`): as in a shell pipeline, CMD's next
            # write here gets SIGPIPE, and the run ends with CMD's own status for
            # everyone. Reading on let an endless CMD fill the spool.
            pipe.close()
            return

    def exit_code(self, code: int) -> int:
        """The leader's own exit code for a run that ended with ``code``: 1 if its
        own output could not be written while CMD succeeded (as ``cat`` does)."""
        return 1 if code == 0 and self.write_failed else code

    # -- a joiner ---------------------------------------------------------------

    def on_join(self) -> None:
        """Say that this call joined (the key, the leader's pid and host, how long it
        has run: from the group's status), then follow the leader's output."""
        flight, why = self._flight()
        leader, age, path = "", 0.0, None
        line = f"joined the run of {self.key!r} in flight"
        if flight is not None:
            pid, host = flight.get("leader_pid"), flight.get("host") or socket.gethostname()
            age = float(flight.get("age_s") or 0.0)
            leader = f" (leader pid {pid} on {host})"
            line += f"{leader[:-1]}, running for {age:.1f} s)"
            if self.scope.directory is not None and isinstance(flight.get("token"), int):
                path = spool_path(self.scope.directory, self.key, flight["token"])
        else:  # the value names the leader at the end (finish_joined)
            self.leader_unknown = True
            line += f" (leader unknown: {why})"
        _say(line)
        self.follower = _Follower(self.key, path, age, leader, self.withdraw_now)
        self.follower.start()

    def withdraw_now(self) -> None:
        """(The follow thread) our reader went away: the joiner withdraws at once, as
        Ctrl-C makes it, by a SIGINT to the main thread that waits in the call (a real
        signal: only one wakes a blocked wait). Not when something else handles SIGINT
        (cli.main called off the main thread): the joiner then follows to the end."""
        main = threading.main_thread()
        if self.handles_sigint and main.ident is not None:
            signal.pthread_kill(main.ident, signal.SIGINT)

    def _flight(self) -> tuple[dict[str, Any] | None, str]:
        """The running flight of our key, from the group's status request; else None
        and why not."""
        scope = internals(self.group).scope
        if scope is None:
            return None, "this scope has no status"
        try:
            flights = scope.status()
        except Exception as exc:  # the line says so, the run goes on
            text = " ".join(str(exc).split())
            return None, f"the status request failed: {type(exc).__name__}: {text}"
        for flight in flights:
            if flight.get("key") == self.key:
                return flight, ""
        return None, "its flight is not in the group's status: it may have just ended"

    def finish_joined(self, value: Any) -> int:
        """Write the rest of the leader's output; its exit code."""
        if not isinstance(value, dict) or not isinstance(value.get("exit"), int):
            _say(f"the leader of {self.key!r} sent a value this version does not read")
            return 1
        follower = self.follower or _Follower(self.key, None, 0.0, "")
        spool = value.get("spool")
        follower.finish(spool if isinstance(spool, str) else None)
        output = value.get("output")
        if isinstance(output, str):  # the fleet scope: the output comes now, at once
            follower.emit(decode_records(output))
            if value.get("dropped"):
                _say(f"the first {value['dropped']} bytes of the leader's output were dropped")
        if self.leader_unknown and value.get("pid") is not None:
            _say(f"the run of {self.key!r} was led by pid {value['pid']} on {value.get('host')}")
        exit_code: int = value["exit"]
        if follower.reader_gone:
            return EXIT_SIGPIPE
        return 1 if exit_code == 0 and follower.write_failed else exit_code


def _install(handler: Callable[[int, FrameType | None], None]) -> dict[int, Any]:
    """Install ``handler`` for SIGINT and SIGTERM (main thread only); the old ones."""
    old: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return old
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue  # started with it ignored (a background job): keep it so
        old[signum] = signal.signal(signum, handler)
    return old


def run_command(
    scope: Scope, key: str, cmd: Sequence[str], timeout: float | None, fresh: bool
) -> int:
    """``flightgroup run``: lead or join the run of ``key``; the exit code."""
    if not key:
        raise UsageError("--key must not be empty")
    if not cmd:
        raise UsageError("run needs a command after --: flightgroup run --key KEY -- CMD [ARG...]")
    group = open_group(scope)
    assert group is not None
    run = _Run(group, scope, key, cmd)
    old = _install(run.on_signal)
    run.handles_sigint = signal.SIGINT in old
    try:
        return _run_in(run, group, timeout, fresh)
    except KeyboardInterrupt:
        # The SIGINT withdraw_now sent may land once the call returned (the run ended
        # meanwhile): still the quiet end of a joiner whose reader went away.
        follower = run.follower
        if follower is None or not follower.reader_gone:
            raise
        follower.abandon()
        return EXIT_SIGPIPE
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
        group.close()


def _run_in(run: _Run, group: FlightGroup, timeout: float | None, fresh: bool) -> int:
    key = run.key
    try:
        result = group.run_sync(key, run.work, on_join=run.on_join, timeout=timeout, fresh=fresh)
    except TimeoutError:
        if run.leading:
            return _leader_after_wait(run)
        if run.follower is not None:
            run.follower.abandon()
        _say(f"gave up waiting for the run of {key!r} after {timeout:g} s (--timeout); it goes on")
        return EXIT_TIMEOUT
    except KeyboardInterrupt:
        if run.leading:
            return _leader_after_wait(run)
        if run.follower is not None:
            run.follower.abandon()
            if run.follower.reader_gone:  # our reader went away: quietly, as a pipeline
                return EXIT_SIGPIPE
        _say(f"interrupted; the run of {key!r} goes on for the others")
        return EXIT_SIGINT
    except FlightInterruptedError as exc:
        if run.follower is not None:
            run.follower.finish(None)  # what the leader wrote before it stopped
        _say(f"the leader of {key!r} stopped before its run ended ({exc}); try again")
        return EXIT_INTERRUPTED
    except FlightFailedError as exc:
        if run.follower is not None:
            run.follower.finish(None)
        _say(f"the leader's run of {key!r} failed: {exc.error_type}: {exc.message}")
        return 1
    except FlightError as exc:
        if run.leading and run.done.is_set():  # CMD ran; only the landing went wrong
            _say(f"{exc} (the joiners of this run did not get its outcome)")
            return _leader_after_wait(run)
        if run.follower is not None:
            # It had joined: the scope went away while it waited (Redis lost mid-wait).
            # Not bad usage: like a leader that died, running again may work.
            run.follower.finish(None)
            _say(f"lost the run of {key!r} while waiting for it ({exc}); try again")
            return EXIT_INTERRUPTED
        raise
    except OSError as exc:
        if run.leading:  # the work itself failed (its spool), not CMD
            _say(f"the run of {key!r} failed: {exc}")
            return 1
        raise
    if result.joined:
        return run.finish_joined(result.value)
    exit_code: int = result.value["exit"]
    return run.exit_code(exit_code)


def _leader_after_wait(run: _Run) -> int:
    """The leader stopped waiting (its own --timeout) while CMD runs: the run is its
    own, so it waits for CMD, and for the landing to leave, then exits as CMD did."""
    run.done.wait()
    thread = run.work_thread
    if thread is not None and thread is not threading.current_thread():
        thread.join()  # the work's thread hands the outcome over before it ends
    if run.value is None:
        return 1
    exit_code: int = run.value["exit"]
    return run.exit_code(exit_code)
