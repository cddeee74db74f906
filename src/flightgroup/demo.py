"""``flightgroup demo``: three processes on a temporary directory share one run.

The parent starts three worker processes (``python -m flightgroup.demo worker DIR
NAME``). Each opens ``FlightGroup(directory=DIR, codec=JSON)`` and asks for the key
"daily-report" from 200 asyncio tasks and 8 threads at once, once all three are
connected (a barrier of files in the directory). One call in one process leads; its
work appends to a journal file and takes a second, as an expensive report would, so
the two other processes join it. Every worker prints one JSON line with what its
callers got; the parent narrates.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from .codec import JSON
from .group import FlightGroup, Result

__all__ = ["demo"]

_KEY = "daily-report"
_TASKS = 200
_THREADS = 8
_PROCESSES = ("alpha", "bravo", "charlie")


def _worker(directory: str, name: str) -> int:
    journal = os.path.join(directory, "journal")
    group = FlightGroup(directory=os.path.join(directory, "flights"), codec=JSON)
    # Connect (a first call of a key of our own), then wait for the others: the three
    # herds then come at once, as a burst of requests would.
    group.run_sync(f"hello-{name}", lambda: name)
    with open(os.path.join(directory, f"ready-{name}"), "w", encoding="utf-8"):
        pass
    end = time.monotonic() + 30
    while time.monotonic() < end and not all(
        os.path.exists(os.path.join(directory, f"ready-{other}")) for other in _PROCESSES
    ):
        time.sleep(0.005)

    def append_journal() -> None:
        with open(journal, "a", encoding="utf-8") as f:
            f.write(f"{name} {os.getpid()}\n")

    async def build_report() -> dict[str, Any]:
        append_journal()  # one short line: not worth a thread
        await asyncio.sleep(1.0)  # the expensive part
        return {"report": "daily", "built_by": name, "pid": os.getpid()}

    def sync_report() -> dict[str, Any]:  # a thread that leads runs the same work
        return asyncio.run(build_report())

    async def main() -> dict[str, Any]:
        tasks = [asyncio.create_task(group.run(_KEY, build_report)) for _ in range(_TASKS)]
        thread_results: list[Result[Any]] = []

        def thread_call() -> None:
            thread_results.append(group.run_sync(_KEY, sync_report))

        threads = [threading.Thread(target=thread_call) for _ in range(_THREADS)]
        for thread in threads:
            thread.start()
        results = await asyncio.gather(*tasks)
        for thread in threads:
            await asyncio.to_thread(thread.join)
        every = [*results, *thread_results]
        stats = group.stats()
        return {
            "name": name,
            "pid": os.getpid(),
            "calls": len(every),
            "led": sum(not r.joined for r in every),
            "values": sorted({json.dumps(r.value, sort_keys=True) for r in every}),
            "tokens": sorted({r.token for r in every}),
            "stats": {  # the herd's key only: the hello call was a flight of its own
                "calls": stats.calls - 1,
                "flights": stats.flights - 1,
                "joins": stats.joins,
            },
        }

    try:
        report = asyncio.run(main())
    finally:
        group.close()
    print(json.dumps(report), flush=True)
    return 0


def demo() -> int:
    """Run the three-process demo on a temporary directory; 0 if they shared one run."""
    directory = tempfile.mkdtemp(prefix="fgdemo", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        flights = os.path.join(directory, "flights")
        print("flightgroup demo: three processes share one directory group")
        print(f"  FlightGroup(directory={flights!r}, codec=JSON)\n")
        print(
            f"Each process asks for {_KEY!r} from {_TASKS} asyncio tasks and {_THREADS} "
            "threads at once.\n"
        )
        started = time.perf_counter()
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "flightgroup.demo", "worker", directory, name],
                stdout=subprocess.PIPE,
                text=True,
            )
            for name in _PROCESSES
        ]
        reports = []
        for worker in workers:
            out, _ = worker.communicate(timeout=60)
            if worker.returncode != 0 or not out.strip():
                print(f"a worker failed (exit {worker.returncode})", file=sys.stderr)
                return 1
            reports.append(json.loads(out.strip().splitlines()[-1]))
        elapsed = time.perf_counter() - started
        with open(os.path.join(directory, "journal"), encoding="utf-8") as f:
            runs = f.read().split("\n")
        runs = [line for line in runs if line]
        values = {value for report in reports for value in report["values"]}
        tokens = {token for report in reports for token in report["tokens"]}
        for report in reports:
            role = "led the flight" if report["led"] else "joined it"
            print(
                f"  {report['name']:8} pid {report['pid']:>7}: {report['calls']} calls, "
                f"{report['led']} led; this process {role} "
                f"(local stats: calls={report['stats']['calls']} "
                f"flights={report['stats']['flights']} joins={report['stats']['joins']})"
            )
        print()
        print(f"  the journal has {len(runs)} run: {runs[0] if runs else '-'}")
        print(f"  every caller got the same value: {len(values) == 1} -> {values.pop()}")
        print(f"  one fencing token for all: {sorted(tokens)} (epoch {min(tokens) >> 32})")
        print(f"  time: {elapsed:.2f} s (three interpreters started, a 1 s work)")
        calls = sum(report["calls"] for report in reports)
        print(f"\n{calls} calls in 3 processes, 1 run of the work.")
        return 0 if len(runs) == 1 and len(tokens) == 1 else 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        sys.exit(_worker(sys.argv[2], sys.argv[3]))
    sys.exit(demo())
