"""Fresh callers in the process scope (ADR 0005): a fresh caller waits for the flight
in progress to end and leads or joins the next one; a flight that starts later carries
the larger fencing token.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from flightgroup import FlightGroup, current_lease

from ..support import run, until, wait_until


def test_a_flight_that_starts_later_carries_the_larger_token() -> None:
    """A flight that starts later carries the larger fencing token.

    t0 flight F of "k" runs (token 1) in a thread; a fresh caller waits for its end.
    t1 F lands: the IDLE flight G is made for the fresh caller; it has no token yet.
    t2 forget("k") detaches G; a new call leads N (token 2) and N's work starts.
    t3 the fresh caller claims G and leads it: G starts after N, so its token is the
       larger one."""
    g = FlightGroup()
    f_started, f_release = threading.Event(), threading.Event()
    n_started, n_release = threading.Event(), threading.Event()
    g_tokens: list[int] = []

    def f_work() -> str:
        f_started.set()
        assert f_release.wait(5)
        return "F"

    def n_work() -> int:
        n_started.set()
        assert n_release.wait(5)
        return current_lease().token

    async def g_work() -> int:
        g_tokens.append(current_lease().token)
        return current_lease().token

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            f_call = pool.submit(g.run_sync, "k", f_work)
            await until(f_started.is_set, "F started")
            fresh = asyncio.create_task(g.run("k", g_work, fresh=True))
            await until(lambda: g.stats().calls == 2, "the fresh caller waits for F's end")
            # This loop does not run until t3: the claim on G waits here, undelivered.
            f_release.set()
            # t1: F settled, and in the same step G was made (IDLE: not in_flight).
            wait_until(lambda: g.stats().in_flight == 0, "F landed")
            g.forget("k")  # t2
            n_call = pool.submit(g.run_sync, "k", n_work)
            assert n_started.wait(5)
            result = await fresh  # t3
            n_release.set()
            n_token = n_call.result(5).value
            assert f_call.result(5).value == "F"
            assert not result.joined and g_tokens == [result.token]
            assert result.token > n_token, (
                f"G started after N but has token {result.token} < {n_token}"
            )

    run(main())
