"""``flightgroup status``: the flights in progress, and the processes whose threads run
works past their deadlines, once or every second."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from .command_options import Scope, UsageError, open_group
from .errors import UnavailableError
from .group import FlightGroup, internals
from .scope.interface import key_as_shown

__all__ = ["status_command"]

_FIELDS = ("key", "token", "leader_pid", "joiners", "age_s")
_LEFT_FIELDS = ("pid", "left_threads", "max_deadline_threads")
_CONNECT_WAIT = 5.0  # a directory group's first connection (or election) takes a moment
_WATCH_EVERY = 1.0


def _flights(group: FlightGroup | None, fleet: bool) -> list[dict[str, Any]]:
    """The flights of the group as ``--json`` prints them."""
    if group is None:
        return []
    scope = internals(group).scope
    assert scope is not None
    end = time.monotonic() + _CONNECT_WAIT
    while True:
        try:
            raw = scope.status()
            break
        except OSError as exc:  # a path that is no directory group (/proc, a file)
            raise UsageError(f"cannot read the directory: {exc.strerror or exc}") from None
        except UnavailableError:
            # A directory group answers "no coordinator is connected" until its first
            # connection is up; the fleet's UnavailableError is final.
            if fleet or time.monotonic() > end:
                raise
            time.sleep(0.01)
    fields = (*_FIELDS, "host") if fleet else _FIELDS
    flights = [{name: flight.get(name) for name in fields} for flight in raw]
    flights.sort(key=lambda flight: (str(flight["key"]), flight["token"] or 0))
    return flights


def _left(group: FlightGroup | None, fleet: bool) -> list[dict[str, Any]]:
    """The processes of the group with threads left past a deadline (ADR 0038)."""
    if group is None:
        return []
    scope = internals(group).scope
    assert scope is not None
    fields = (*_LEFT_FIELDS, "host") if fleet else _LEFT_FIELDS
    return [{name: entry.get(name) for name in fields} for entry in scope.left_threads()]


def _left_table(left: list[dict[str, Any]], fleet: bool) -> str:
    head = ["PID", "LEFT THREADS", "MAX"] + (["HOST"] if fleet else [])
    rows = [head] + [
        [str(entry["pid"]), str(entry["left_threads"]), str(entry["max_deadline_threads"])]
        + ([str(entry.get("host"))] if fleet else [])
        for entry in left
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(["threads running works past their deadlines:", *lines])


def _table(flights: list[dict[str, Any]], fleet: bool) -> str:
    if not flights:
        return "no flights in progress"
    head = ["KEY", "TOKEN", "LEADER PID", "JOINERS", "AGE"] + (["HOST"] if fleet else [])
    rows = [head]
    for flight in flights:
        row = [
            key_as_shown(str(flight["key"])),
            str(flight["token"]),
            str(flight["leader_pid"]),
            str(flight["joiners"]),
            f"{flight['age_s']:.1f} s" if isinstance(flight["age_s"], (int, float)) else "-",
        ]
        if fleet:
            row.append(str(flight.get("host")))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def status_command(scope: Scope, as_json: bool, watch: bool) -> int:
    """``flightgroup status``; the exit code. Raises UsageError and FlightError."""
    fleet = scope.redis is not None
    group: FlightGroup | None = None
    try:
        while True:
            if group is None:  # (again while we watch: the directory may come)
                # A directory that does not exist has no flights: say so without
                # creating it.
                group = open_group(scope, create=False)
            flights = _flights(group, fleet)
            left = _left(group, fleet)
            if as_json:
                shown: dict[str, Any] = {"flights": flights}
                if left:  # (only then: no thread left past a deadline is {"flights": [...]})
                    shown["left_threads"] = left
                text = json.dumps(shown)
            else:
                text = _table(flights, fleet)
                if left:
                    text = f"{text}\n\n{_left_table(left, fleet)}"
                if watch:
                    stamp = time.strftime("%H:%M:%S")
                    text = f"flightgroup status ({stamp}, Ctrl-C to stop)\n\n{text}\n"
                    # Clear the screen on a terminal only: into a pipe or a file the
                    # escape codes are noise, so each draw simply follows the last.
                    if sys.stdout.isatty():
                        text = "\x1b[H\x1b[2J" + text
            print(text, flush=True)
            if not watch:
                return 0
            time.sleep(_WATCH_EVERY)
    except KeyboardInterrupt:
        if not watch:
            raise
        return 0
    finally:
        if group is not None:
            group.close()
