"""``flightgroup run``: run a command as the leader of a key, or join its run.

The leader's work starts CMD (stdin inherited), passes its stdout and stderr
through live and records them (see ``command_spool``); its value says how CMD
ended. A joiner says that it joined, follows the leader's spool while it waits
(directory scope) or prints the output carried by the value at the end (fleet
scope), and exits with the leader's exit code.

Signals: SIGINT to a joiner withdraws it (exit 130, the run goes on); SIGINT and
SIGTERM to the leader go to CMD, and the flight ends with CMD's own exit status.

What the options name (the scope, its group) is ``command_options``; our own output and
a joiner's view of the leader's is ``command_output``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import IO, Any

from .command_options import Scope, UsageError, open_group
from .command_output import Follower, closed_at_start, failed_to_pass, say, write_all
from .command_spool import (
    STDERR,
    STDOUT,
    Capture,
    SpoolWriter,
    decode_records,
    prune_spools,
    spool_path,
)
from .errors import FlightError, FlightFailedError, FlightInterruptedError
from .group import FlightGroup, internals
from .lease import current_lease

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_SIGINT",
    "EXIT_SIGPIPE",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "run_command",
]

EXIT_USAGE = 2
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: the leader died; running again may work
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_SIGINT = 130  # 128 + SIGINT, as a shell reports it
EXIT_SIGPIPE = 128 + signal.SIGPIPE  # 141, as a shell reports a command SIGPIPE killed
EXIT_CANNOT_RUN = 126  # as a shell: found but not runnable
EXIT_NOT_FOUND = 127

_FLEET_DEFAULT_MAX_VALUE = 1024 * 1024
_VALUE_ROOM = 4096  # the value's other fields and JSON's quoting, beside the output


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


def _exit_status(returncode: int) -> int:
    """A shell's view: killed by signal N is 128+N."""
    return returncode if returncode >= 0 else 128 - returncode


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
        self.follower: Follower | None = None
        # Writing CMD's output to our own stdout or stderr failed (ENOSPC, EIO, ...):
        # the leader says so and exits 1 if CMD succeeded; its joiners are not affected.
        self.write_failed = False
        # Started with SIGINT ignored (a background job of a script): it stays ignored for
        # CMD and from outside; a joiner handles it only to withdraw (``withdrawing``).
        self.sigint_ignored = False
        self.withdrawing = False
        self.signals: dict[int, Any] = {}  # the handlers run_command restores

    # -- signals ---------------------------------------------------------------

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT/SIGTERM: the leader forwards them to CMD; a joiner withdraws."""
        if signum == signal.SIGINT and self.sigint_ignored and not self.withdrawing:
            return  # ignored from outside, as when it started
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
        if (
            self.sigint_ignored
            and self.handles_sigint()
            and threading.current_thread() is threading.main_thread()
        ):
            # (A joiner that now leads, by a takeover) CMD inherits SIGINT ignored, as
            # this process started: a handled signal would be reset to its default.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            message = f"flightgroup: cannot run {self.cmd[0]!r}: {exc.strerror or exc}\n"
            data = message.encode(errors="replace")
            write_all(2, data)
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
        passing = own not in closed_at_start()  # closed by our caller: nothing to pass
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
            error = write_all(own, data)
            if error is None:
                continue
            passing = False
            if failed_to_pass(error, own, "command's"):
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
        say(line)
        if (
            self.sigint_ignored
            and signal.SIGINT not in self.signals
            and threading.current_thread() is threading.main_thread()
        ):
            # A joiner runs no CMD that would inherit the handler: it may take SIGINT
            # for its own withdrawal, and still ignores it from outside (on_signal).
            self.signals[signal.SIGINT] = signal.signal(signal.SIGINT, self.on_signal)
        self.follower = Follower(self.key, path, age, leader, self.withdraw_now)
        self.follower.start()

    def handles_sigint(self) -> bool:
        """on_signal is SIGINT's handler now (the main thread runs the call): a joiner
        whose reader went away may withdraw by sending it SIGINT."""
        return bool(signal.getsignal(signal.SIGINT) == self.on_signal)

    def withdraw_now(self) -> None:
        """(The follow thread) our reader went away: the joiner withdraws at once, as
        Ctrl-C makes it, by a SIGINT to the main thread that waits in the call (a real
        signal: only one wakes a blocked wait). Not when something else handles SIGINT
        (cli.main called off the main thread): the joiner then follows to the end."""
        main = threading.main_thread()
        if self.handles_sigint() and main.ident is not None:
            self.withdrawing = True
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
            say(f"the leader of {self.key!r} sent a value this version does not read")
            return 1
        follower = self.follower or Follower(self.key, None, 0.0, "")
        spool = value.get("spool")
        follower.finish(spool if isinstance(spool, str) else None)
        output = value.get("output")
        if isinstance(output, str):  # the fleet scope: the output comes now, at once
            follower.emit(decode_records(output))
            if value.get("dropped"):
                say(f"the first {value['dropped']} bytes of the leader's output were dropped")
        if self.leader_unknown and value.get("pid") is not None:
            say(f"the run of {self.key!r} was led by pid {value['pid']} on {value.get('host')}")
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
    run.sigint_ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    old = run.signals = _install(run.on_signal)
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
        say(f"gave up waiting for the run of {key!r} after {timeout:g} s (--timeout); it goes on")
        return EXIT_TIMEOUT
    except KeyboardInterrupt:
        if run.leading:
            return _leader_after_wait(run)
        if run.follower is not None:
            run.follower.abandon()
            if run.follower.reader_gone:  # our reader went away: quietly, as a pipeline
                return EXIT_SIGPIPE
        say(f"interrupted; the run of {key!r} goes on for the others")
        return EXIT_SIGINT
    except FlightInterruptedError as exc:
        if run.follower is not None:
            run.follower.finish(None)  # what the leader wrote before it stopped
        say(f"the leader of {key!r} stopped before its run ended ({exc}); try again")
        return EXIT_INTERRUPTED
    except FlightFailedError as exc:
        if run.follower is not None:
            run.follower.finish(None)
        say(f"the leader's run of {key!r} failed: {exc.error_type}: {exc.message}")
        return 1
    except FlightError as exc:
        if run.leading and run.done.is_set():  # CMD ran; only the landing went wrong
            say(f"{exc} (the joiners of this run did not get its outcome)")
            return _leader_after_wait(run)
        if run.follower is not None:
            # It had joined: the scope went away while it waited (Redis lost mid-wait).
            # Not bad usage: like a leader that died, running again may work.
            run.follower.finish(None)
            say(f"lost the run of {key!r} while waiting for it ({exc}); try again")
            return EXIT_INTERRUPTED
        raise
    except OSError as exc:
        if run.leading:  # the work itself failed (its spool), not CMD
            say(f"the run of {key!r} failed: {exc}")
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
