"""What an in-flight key holds does not depend on the flights its process ran before.

CPython (3.11+) keeps an object's attributes in its class's shared keys, and a class
stops taking new names there once a few dozen instances were made: an instance that then
writes a name not among them gets a dict of its own. A flight (and its attempt) writes
some fields only on some paths (the leader's waiter only when the work suspended, the
attempt's timer only under a deadline, its lease only when the work asks for it), so a
process whose first flights took other paths would hold more per in-flight key ever
after. Measured in a fresh interpreter of its own, where the classes are new.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, json, sys, tracemalloc
    from flightgroup import FlightGroup, current_lease

    KEYS = 2000

    async def held_per_key(group, prefix, asks_lease):
        gate = asyncio.Event()

        async def work():
            if asks_lease:
                current_lease()
            await gate.wait()
            return 1

        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        calls = [asyncio.ensure_future(group.run(f"{prefix}{i}", work)) for i in range(KEYS)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        gate.set()
        await asyncio.gather(*calls)
        return held / KEYS

    async def main(options, asks_lease, misses_first):
        group = FlightGroup(**options)

        async def at_once():
            return 1

        if misses_first:  # flights whose work never suspends, nor asks its lease
            for i in range(1000):
                await group.run(f"miss:{i}", at_once)
        # asyncio's set of tasks grows and never shrinks: grown first, the measurement
        # does not pay for its growth.
        gate = asyncio.Event()
        held = [asyncio.ensure_future(gate.wait()) for _ in range(3 * KEYS)]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*held)
        print(json.dumps(await held_per_key(group, "key:", asks_lease)))

    options, asks_lease, misses_first = json.loads(sys.argv[1])
    asyncio.run(main(options, asks_lease, misses_first))
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("options", "asks_lease"),
    [({}, False), ({"deadline": 60.0}, False), ({}, True)],
    ids=["plain", "deadline", "lease"],
)
def test_an_in_flight_key_holds_as_much_after_a_thousand_flights_that_never_suspended(
    options: dict[str, float], asks_lease: bool
) -> None:
    fresh, after_misses = (
        _held_per_key(options, asks_lease, misses_first=first) for first in (False, True)
    )
    # Equal but for a few bytes; a dict per flight or attempt is about 300-450 B.
    assert after_misses - fresh < 64, (fresh, after_misses)


def _held_per_key(options: dict[str, float], asks_lease: bool, *, misses_first: bool) -> float:
    """Bytes per in-flight key in a fresh interpreter, after 1,000 flights whose work
    never suspended if ``misses_first``."""
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps([options, asks_lease, misses_first])],
        capture_output=True,
        text=True,
        timeout=25,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    held: float = json.loads(proc.stdout)
    return held
