"""The ``flightgroup`` command line.

``demo`` is built; ``run``, ``status`` and ``bench`` come with the directory
scope and the command-line issue, and say so (exit 2) until then.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Sequence

from .group import FlightGroup, Result

__all__ = ["main"]

_TASKS = 1_000
_THREADS = 32


def _demo() -> int:
    """1,000 asyncio tasks and 32 threads call one key at once: one run."""
    group = FlightGroup()
    runs: list[float] = []  # the journal: one entry per run of the work
    expected_joiners = _TASKS - 1 + _THREADS
    joined = 0
    joined_lock = threading.Lock()
    all_joined = threading.Event()

    def on_join() -> None:
        nonlocal joined
        with joined_lock:
            joined += 1
            if joined == expected_joiners:
                all_joined.set()

    work_started = asyncio.Event()

    async def build_report() -> str:
        runs.append(time.perf_counter())
        work_started.set()
        # Hold the flight until every caller has joined (or 10 s pass), so the
        # demo shows a full herd sharing one run whatever the machine's speed.
        await asyncio.to_thread(all_joined.wait, 10.0)
        return f"report #{len(runs)}"

    def sync_report() -> str:  # never runs: the threads always join
        runs.append(time.perf_counter())
        return "report from a thread"

    async def main() -> None:
        started = time.perf_counter()
        leader = asyncio.create_task(group.run("daily-report", build_report))
        await work_started.wait()
        thread_results: list[Result[str]] = []

        def thread_call() -> None:
            thread_results.append(group.run_sync("daily-report", sync_report, on_join=on_join))

        threads = [threading.Thread(target=thread_call) for _ in range(_THREADS)]
        for thread in threads:
            thread.start()
        joiners = [
            asyncio.create_task(group.run("daily-report", build_report, on_join=on_join))
            for _ in range(_TASKS - 1)
        ]
        results = [await leader, *await asyncio.gather(*joiners)]
        for thread in threads:
            await asyncio.to_thread(thread.join)
        elapsed = time.perf_counter() - started
        every = results + thread_results
        leaders = [r for r in every if not r.joined]
        print("flightgroup demo: one process, 1,000 asyncio tasks and 32 threads ask for")
        print('the key "daily-report" at the same time.\n')
        print(f"  led:    {len(leaders)} call (an asyncio task), token {leaders[0].token}")
        print(f"  joined: {sum(r.joined for r in results)} asyncio tasks")
        print(f"          {sum(r.joined for r in thread_results)} threads (run_sync)")
        values = {r.value for r in every}
        print(f"  value:  {values.pop()!r} for every caller")
        print(f"  runs of the work: {len(runs)}   (the journal has {len(runs)} entry)")
        print(f"  time:   {elapsed * 1000:.0f} ms\n")
        stats = group.stats()
        print(
            f"stats: calls={stats.calls} flights={stats.flights} joins={stats.joins} "
            f"coalescing_ratio={stats.coalescing_ratio:.4f} joiners_max={stats.joiners_max}"
        )

    asyncio.run(main())
    group.close()
    return 0 if len(runs) == 1 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flightgroup`` command."""
    parser = argparse.ArgumentParser(
        prog="flightgroup",
        description="Single flight: one run per key, every concurrent caller joins it.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("demo", help="show many callers sharing one run")
    for name, purpose in (
        ("run", "run a command as the leader of a key, or join the run in flight"),
        ("status", "list the flights in progress"),
        ("bench", "run the benchmark suite"),
    ):
        commands.add_parser(name, help=f"{purpose} (not built yet)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _demo()
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    print(f"flightgroup {args.command}: not built yet in this version", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
