"""``python -m benchmarks.codecs``: a flight's value through each codec, side by side.

One realistic outcome (a daily report: a dataclass with dates, a datetime, Decimals,
nested lines, tuples and an int-keyed dict; about 3 KB of JSON) is encoded once and
decoded once, as one leader and one caller do, by:

- ``TypedCodec`` made for ``Report`` (JSON, then MessagePack): the value comes back as a
  ``Report``; its encode checks the value against the type (ADR 0043);
- ``TypedCodec()`` untyped (what a plain ``run`` gets);
- ``flightgroup.JSON`` on the equivalent plain dict (dates and Decimals as strings): what
  a caller got before issue 29, a dict and no types;
- ``flightgroup.PICKLE`` on the dataclass (types kept; trusted groups only);
- pydantic v2's ``TypeAdapter(Report)`` (``dump_json`` + ``validate_json``; its dump
  checks nothing), when pydantic is installed.

Rounds interleave the candidates (noise from other processes hits all alike) and each
candidate's best round is kept. Prints microseconds per encode, per decode and per
encode + decode, the encoded size, and the ratio of each encode + decode to JSON's: the
ratio of the bests and the median of the ratios taken round by round (both sides of a
ratio ran back to back).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import decimal
import importlib.util
import sys
import time
from collections.abc import Callable
from statistics import median
from typing import Any

from flightgroup import JSON, PICKLE
from flightgroup.typed import TypedCodec


@dataclasses.dataclass
class Line:
    sku: str
    name: str
    quantity: int
    unit_price: decimal.Decimal
    tags: tuple[str, ...]


@dataclasses.dataclass
class Report:
    day: datetime.date
    generated: datetime.datetime
    region: str
    total: decimal.Decimal
    lines: list[Line]
    by_store: dict[int, decimal.Decimal]
    notes: str | None = None


def report() -> Report:
    """The measured value: 24 lines and 12 stores (about 3 KB as JSON)."""
    lines = [
        Line(f"SKU-{n:05d}", f"item number {n}", n % 7 + 1,
             decimal.Decimal(f"{n * 3 % 100}.{n % 100:02d}"), ("promo", f"aisle-{n % 9}"))
        for n in range(24)
    ]
    return Report(
        day=datetime.date(2026, 12, 2),
        generated=datetime.datetime(2026, 12, 2, 6, 30, tzinfo=datetime.UTC),
        region="eu-west",
        total=sum((line.unit_price * line.quantity for line in lines), decimal.Decimal(0)),
        lines=lines,
        by_store={store: decimal.Decimal(f"{store * 101}.50") for store in range(12)},
    )


def as_plain(value: Report) -> dict[str, Any]:
    """The same report as JSON can carry it: strings for dates and Decimals."""
    return {
        "day": value.day.isoformat(),
        "generated": value.generated.isoformat(),
        "region": value.region,
        "total": str(value.total),
        "lines": [
            {"sku": line.sku, "name": line.name, "quantity": line.quantity,
             "unit_price": str(line.unit_price), "tags": list(line.tags)}
            for line in value.lines
        ],
        "by_store": {str(store): str(amount) for store, amount in value.by_store.items()},
        "notes": value.notes,
    }


Step = Callable[[], Any]


def candidates(value: Report) -> dict[str, tuple[Step, Step, int]]:
    """Name -> (one encode, one decode, encoded size), each over its own copy."""
    found: dict[str, tuple[Step, Step, int]] = {}

    def add(name: str, encode: Callable[[Any], bytes], decode: Callable[[bytes], Any],
            item: Any) -> None:
        data = encode(item)
        found[name] = (lambda: encode(item), lambda: decode(data), len(data))

    typed = TypedCodec().for_type(Report, name="bench.report")
    packed = TypedCodec(format="msgpack").for_type(Report, name="bench.report")
    untyped = TypedCodec()
    assert typed.decode(typed.encode(value)) == value
    add("TypedCodec for Report (JSON)", typed.encode, typed.decode, value)
    add("TypedCodec for Report (MessagePack)", packed.encode, packed.decode, value)
    add("TypedCodec() untyped", untyped.encode, untyped.decode, value)
    add("flightgroup.JSON, plain dict", JSON.encode, JSON.decode, as_plain(value))  # type: ignore[arg-type]
    add("flightgroup.PICKLE", PICKLE.encode, PICKLE.decode, value)  # type: ignore[arg-type]
    if importlib.util.find_spec("pydantic") is not None:
        import pydantic

        adapter: Any = pydantic.TypeAdapter(Report)
        assert adapter.validate_json(adapter.dump_json(value)) == value
        add(f"pydantic {pydantic.VERSION} TypeAdapter", adapter.dump_json,
            adapter.validate_json, value)
    return found


def one_round(step: Step, times: int) -> float:
    """Seconds per call of ``step``."""
    started = time.perf_counter()
    for _ in range(times):
        step()
    return (time.perf_counter() - started) / times


def measure(times: int, rounds: int) -> tuple[dict[str, list[tuple[float, float]]],
                                               dict[str, int]]:
    """Per candidate, (µs per encode, µs per decode) of each round; and its sizes."""
    found = candidates(report())
    for encode, decode, _ in found.values():  # warm up
        one_round(encode, max(1, times // 10))
        one_round(decode, max(1, times // 10))
    result: dict[str, list[tuple[float, float]]] = {name: [] for name in found}
    items = list(found.items())
    for index in range(rounds):
        shift = index % len(items)  # rotate who goes first
        for name, (encode, decode, _) in items[shift:] + items[:shift]:
            result[name].append((one_round(encode, times) * 1e6, one_round(decode, times) * 1e6))
    return result, {name: size for name, (_, _, size) in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.codecs",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--times", type=int, default=2_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds; the best is kept")
    args = parser.parse_args(argv)
    result, sizes = measure(args.times, args.rounds)
    base_name = "flightgroup.JSON, plain dict"
    base = [encode + decode for encode, decode in result[base_name]]
    print(f"Python {sys.version.split()[0]}; one encode and one decode of a {sizes[base_name]}"
          f"-byte (as JSON) report, {args.times} calls per round, {args.rounds} rounds")
    print()
    print("| codec | encode µs | decode µs | encode + decode µs | bytes | "
          "ratio of bests to JSON | median ratio per round |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, rounds in result.items():
        both = [encode + decode for encode, decode in rounds]
        paired = median(mine / theirs for mine, theirs in zip(both, base, strict=True))
        print(f"| {name} | {min(e for e, _ in rounds):.1f} | {min(d for _, d in rounds):.1f} | "
              f"{min(both):.1f} | {sizes[name]:,} | {min(both) / min(base):.2f} | "
              f"{paired:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
