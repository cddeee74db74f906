#!/usr/bin/env python3
"""The long fuzz run of a live directory coordinator (docs/fuzzing.md).

Starts the same live coordinator as tests/directory/test_fuzz.py (a child process whose
group coordinates and leads the flight "held", and a joiner of it), then feeds it the
test file's hypothesis strategies in rounds until at least ``--frames`` fuzz frames were
sent, with every check of the tests after every example. At the end "held" is released:
its joiner must get the leader's value, and the work must have run once. Prints a
summary; exits 0 when nothing was found, 1 otherwise.

    scripts/dev python scripts/fuzz_coordinator.py                  # 100,000 frames
    scripts/dev python scripts/fuzz_coordinator.py --frames 1000000 --seed 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example(live: Any, name: str, exercise: Any) -> Callable[[Any], None]:
    def one(case: Any) -> None:
        frames, sent = exercise(live, case)
        live.counters.add(name, frames, sent)
        live.check()

    return one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="fuzz frames to send")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default random)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)

    from hypothesis import given, seed, settings

    from tests.directory import test_fuzz as fz

    exercises: list[tuple[str, Any, Callable[[Any, Any], tuple[int, int]], int]] = [
        # (name, strategy, exercise, examples per round)
        ("well-formed", fz.well_formed_cases(), lambda lv, c: fz.exercise_frames(lv, *c), 300),
        ("mutated", fz.mutated_cases(), lambda lv, c: fz.exercise_frames(lv, *c), 300),
        ("random", fz.random_cases(), lambda lv, c: fz.exercise_frames(lv, *c), 150),
        ("hello", fz.hello_cases(), fz.exercise_hello, 150),
        ("interleaved", fz.interleavings(), fz.exercise_interleaving, 150),
        ("delivery", fz.DELIVERIES, fz.exercise_delivery, 100),
        ("scenario", fz.SOUP_ACTIONS, fz.exercise_soup, 100),
    ]
    started = time.monotonic()
    live = fz.Live()
    counters = live.counters
    print(
        f"coordinator pid {live.leader.proc.pid} (epoch {live.epoch}), joiner pid "
        f"{live.joiner.proc.pid if live.joiner else None}, directory {live.dir}",
        flush=True,
    )
    failure = None
    rounds = 0
    try:
        while counters.frames < args.frames:
            for n, (name, strategy, exercise, examples) in enumerate(exercises):
                one = _example(live, name, exercise)
                test = settings(fz.FUZZ, max_examples=examples)(given(strategy)(one))
                if args.seed is not None:
                    test = seed(args.seed * 1000 + rounds * len(exercises) + n)(test)
                test()
            rounds += 1
            print(
                f"round {rounds}: {counters.frames} frames, {counters.examples} examples, "
                f"{time.monotonic() - started:.0f} s",
                flush=True,
            )
        live.finish()
    except BaseException:
        failure = traceback.format_exc()
    finally:
        stderr = "".join(live.leader.stderr)
        live.close()
    elapsed = time.monotonic() - started
    print()
    print(f"frames sent:       {counters.frames} ({counters.bytes} bytes of fuzz input)")
    for name, frames in counters.by_strategy.items():
        print(f"  {name:<16} {frames}")
    print(f"examples:          {counters.examples} in {rounds} rounds")
    print(f"connections:       {counters.connections}")
    print(f"liveness probes:   {counters.probes} (fresh connection, handshake, status)")
    print(f"scenario fences:   {counters.fences} (status round trips between scenario steps)")
    print(f"duration:          {elapsed:.1f} s")
    print(f"coordinator stderr: {len(stderr.splitlines())} lines")
    if stderr:
        print(stderr[-3000:])
    if failure is not None:
        print("RESULT: FAILED")
        print(failure)
        return 1
    print("RESULT: OK: the coordinator served throughout; 'held' ran once, its joiner got it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
