"""Imported inside the example servers the tests start: holds the expensive work until
the test says go, and records every start and every join in files the test reads.

The folder is ``$FLIGHTGROUP_EXAMPLE_HOLD``. Each line is written by one ``write`` on a
file opened for appending, so the lines of several processes never mix:

- ``started``: one line per run of the held function (the claim "it ran once");
- ``joined``: one line per call that joined a flight (an ``on_join`` added to every
  ``run``/``run_sync`` call of every FlightGroup), written before that call waits;
- ``go``: made by the test once every request is a leader or a joiner; the held work
  then goes on to the example's own function.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import time
from collections.abc import Callable
from typing import Any

from flightgroup import FlightGroup

FOLDER = os.environ.get("FLIGHTGROUP_EXAMPLE_HOLD", "")
WAIT = 30.0  # past it the held work fails, and the test with it: never a hang


def record(name: str, line: str) -> None:
    """Append one line to the file ``name`` of the folder."""
    fd = os.open(os.path.join(FOLDER, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{line} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def _released() -> bool:
    return os.path.exists(os.path.join(FOLDER, "go"))


def hold(module: Any, name: str) -> None:
    """Replace ``module.name`` (a function or a coroutine function) with one that records
    its start and waits for ``go`` before it runs the original."""
    original: Callable[..., Any] = getattr(module, name)
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def held_async(*args: Any, **kwargs: Any) -> Any:
            record("started", name)
            end = time.monotonic() + WAIT
            while not _released():
                if time.monotonic() > end:
                    raise TimeoutError("the test never said go")
                await asyncio.sleep(0.01)
            return await original(*args, **kwargs)

        setattr(module, name, held_async)
        return

    @functools.wraps(original)
    def held(*args: Any, **kwargs: Any) -> Any:
        record("started", name)
        end = time.monotonic() + WAIT
        while not _released():
            if time.monotonic() > end:
                raise TimeoutError("the test never said go")
            time.sleep(0.01)
        return original(*args, **kwargs)

    setattr(module, name, held)


def _joining(on_join: Callable[[], object] | None) -> Callable[[], None]:
    def joined() -> None:
        record("joined", "call")
        if on_join is not None:
            on_join()

    return joined


def count_joins() -> None:
    """Make every ``run`` and ``run_sync`` call record its join in ``joined``."""
    run, run_sync = FlightGroup.run, FlightGroup.run_sync

    async def counted_run(self: FlightGroup, key: str, work: Any, **options: Any) -> Any:
        options["on_join"] = _joining(options.get("on_join"))
        return await run(self, key, work, **options)

    def counted_run_sync(self: FlightGroup, key: str, work: Any, **options: Any) -> Any:
        options["on_join"] = _joining(options.get("on_join"))
        return run_sync(self, key, work, **options)

    FlightGroup.run = counted_run  # type: ignore[method-assign]
    FlightGroup.run_sync = counted_run_sync  # type: ignore[method-assign]
