"""The ``flightgroup`` command line (see docs/cli.md).

``run`` (``flightgroup.command``) runs a command once per key for every caller
at the same time; ``status`` (``flightgroup.command_status``) lists the flights
in progress; ``demo`` shows three processes sharing one run; ``bench`` runs the
benchmark suite of a source checkout. Bad usage exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .command import (
    EXIT_INTERRUPTED,
    EXIT_SIGINT,
    EXIT_SIGPIPE,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    run_command,
)
from .command_options import UsageError, default_directory, parse_timeout, scope_from_args
from .command_output import hold_standard_fds
from .errors import FlightError

__all__ = ["main"]



def _run_epilog() -> str:
    fallback = os.path.join(tempfile.gettempdir(), f"flightgroup-{os.getuid()}")
    here = default_directory()
    return f"""\
The first caller of KEY runs CMD (stdin inherited) and passes its output through;
a caller that comes while it runs joins it: it says so on stderr, writes the
leader's stdout and stderr as they come (at the end in the fleet scope) and exits
with the leader's exit code (a CMD killed by signal N gives 128+N).

--dir defaults to $XDG_RUNTIME_DIR/flightgroup, else to the 0700 folder
{fallback}; here: {here}.

exit codes: CMD's own; {EXIT_INTERRUPTED} the leader died; {EXIT_TIMEOUT} --timeout passed
(a joiner); {EXIT_SIGINT} SIGINT to a joiner (the run goes on; SIGINT to the leader
goes to CMD); {EXIT_USAGE} bad usage.
"""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (UsageError), not usage text."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _scope_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="DIR",
        help="the directory group (default: $XDG_RUNTIME_DIR/flightgroup, else a 0700 "
        "folder flightgroup-<uid> in the temp dir)",
    )
    parser.add_argument("--redis", metavar="URL", help="the fleet group's Redis URL")
    parser.add_argument("--namespace", metavar="NS", help="the fleet group's namespace")


def _parser() -> _Parser:
    parser = _Parser(
        prog="flightgroup",
        description="Single flight: one run per key, every concurrent caller joins it.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = commands.add_parser(
        "run",
        help="run a command as the leader of a key, or join the run in flight",
        usage="flightgroup run --key KEY [--dir DIR | --redis URL --namespace NS] "
        "[--timeout S] [--fresh] -- CMD [ARG...]",
        description="Run CMD once for every caller of KEY at the same time.",
        epilog=_run_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--key", required=True, help="what makes two runs the same")
    _scope_options(run)
    run.add_argument(
        "--timeout", metavar="S", help="a joiner's wait limit in seconds (exit 124 past it)"
    )
    run.add_argument(
        "--fresh", action="store_true", help="join only a run that starts after this call"
    )
    status = commands.add_parser(
        "status",
        help="list the flights in progress",
        description="List the flights in progress: key, token, leader pid, joiners, age.",
    )
    _scope_options(status)
    status.add_argument("--json", action="store_true", help='print {"flights": [...]} as JSON')
    status.add_argument("--watch", action="store_true", help="refresh every second until Ctrl-C")
    commands.add_parser(
        "demo",
        help="show three processes sharing one run",
        description="Three processes share one run of a key on a temporary directory.",
    )
    bench = commands.add_parser(
        "bench",
        help="run the benchmark suite (needs a source checkout)",
        description="Run the benchmark suite (python -m benchmarks) of the source checkout "
        "this flightgroup comes from, and print its report.",
    )
    bench.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    return parser


def checkout_root() -> Path | None:
    """The source checkout this flightgroup is imported from (src/flightgroup next to
    benchmarks/), or None for an installed wheel."""
    root = Path(__file__).resolve().parent.parent.parent
    if (root / "benchmarks" / "__main__.py").is_file() and (root / "src" / "flightgroup").is_dir():
        return root
    return None


def _bench(quick: bool) -> int:
    root = checkout_root()
    if root is None:
        raise UsageError(
            "bench needs a source checkout (the benchmarks package beside src/); "
            "an installed flightgroup has none"
        )
    # A process of its own, from the checkout root, exactly as `python -m benchmarks`.
    command = [sys.executable, "-m", "benchmarks", *(["--quick"] if quick else [])]
    return subprocess.run(command, cwd=root, check=False).returncode


def _dispatch(argv: list[str]) -> int:
    # Everything after the first `--` is CMD, never options of ours.
    cmd: list[str] | None = None
    if "--" in argv:
        at = argv.index("--")
        argv, cmd = argv[:at], argv[at + 1 :]
    parser = _parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if args.command != "run" and cmd is not None:
        raise UsageError(f"{args.command} takes no -- CMD")
    if args.command == "run":
        if cmd is None:
            raise UsageError("run needs -- CMD: flightgroup run --key KEY -- CMD [ARG...]")
        scope = scope_from_args(args.dir, args.redis, args.namespace)
        return run_command(scope, args.key, cmd, parse_timeout(args.timeout), args.fresh)
    if args.command == "status":
        from .command_status import status_command

        scope = scope_from_args(args.dir, args.redis, args.namespace)
        return status_command(scope, args.json, args.watch)
    if args.command == "bench":
        return _bench(args.quick)
    if args.command == "demo":
        from .demo import demo

        return demo()
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flightgroup`` command; its exit code."""
    hold_standard_fds()
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except (UsageError, FlightError) as exc:  # FlightError: NFS, unreachable Redis, ...
        print(f"flightgroup: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("flightgroup: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except BrokenPipeError:
        # Our reader left (`flightgroup status --watch --json | head -1`): end as a
        # command killed by SIGPIPE would, without a traceback. Python ignores SIGPIPE,
        # so the write raised instead; stdout goes to /dev/null so that the flush at
        # exit does not raise again.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
