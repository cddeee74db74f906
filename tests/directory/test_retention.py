"""Retention in the directory scope: the leader's bounds (max_items, max_bytes) travel in
its landing and the coordinator applies them to the group's kept outcomes (API.md: "LRU
by items, then by encoded bytes; a hit counts as a use").
"""

from __future__ import annotations

import os

import pytest

from flightgroup import FlightFailedError, Retention
from flightgroup.directory import wire

from ..dirproc import HELLO_OK, RawConn
from ..ingroup import arbiter, close, coordinating, group

pytestmark = pytest.mark.timeout(60)


def test_a_hit_counts_as_a_use_for_max_items(directory: str) -> None:
    """A hit on a kept outcome counts as a use for max_items' LRU."""
    a = coordinating(directory, retention=Retention(success=60.0, max_items=2))
    b = group(directory, retention=Retention(success=60.0, max_items=2))
    try:
        a.run_sync("k1", lambda: 1)
        a.run_sync("k2", lambda: 2)
        assert b.run_sync("k1", lambda: 0).joined is True  # a hit: k1 is used last
        a.run_sync("k3", lambda: 3)  # evicts the least recently used: k2
        assert (b.run_sync("k1", lambda: 0).value, b.run_sync("k3", lambda: 0).value) == (1, 3)
        again = b.run_sync("k2", lambda: 22)
        assert (again.value, again.joined) == (22, False)
    finally:
        close(a, b)


def test_max_bytes_evicts_the_least_recently_used_until_the_rest_fits(directory: str) -> None:
    """max_bytes evicts the least recently used kept outcomes until the rest fits."""
    keep = Retention(success=60.0, max_bytes=30)
    a = coordinating(directory, retention=keep)
    b = group(directory, retention=keep)
    try:
        a.run_sync("k1", lambda: "x" * 10)  # 12 bytes of JSON
        a.run_sync("k2", lambda: "y" * 10)  # 24 in all
        a.run_sync("k3", lambda: "z" * 10)  # 36: k1 goes
        assert b.run_sync("k2", lambda: "").joined is True
        assert b.run_sync("k3", lambda: "").joined is True
        assert b.run_sync("k1", lambda: "new").joined is False
        assert arbiter(a)._coordinator._outcomes.kept.bytes <= 30  # type: ignore[union-attr]
    finally:
        close(a, b)


def test_an_outcome_over_max_bytes_alone_drops_the_keys_older_one(directory: str) -> None:
    """An outcome over max_bytes alone is not kept and drops the key's older kept one."""
    a = coordinating(directory, retention=Retention(success=60.0, max_bytes=20))
    b = group(directory, retention=Retention(success=60.0, max_bytes=20))
    try:
        a.run_sync("k", lambda: "small")
        a.run_sync("other", lambda: "kept")
        a.run_sync("k", lambda: "x" * 40, fresh=True)  # over max_bytes: not kept
        again = b.run_sync("k", lambda: "new")
        assert (again.value, again.joined) == ("new", False)  # nor is the older one
        assert b.run_sync("other", lambda: "").value == "kept"  # the others stay
    finally:
        close(a, b)


def test_a_kept_failure_counts_its_type_module_and_message(directory: str) -> None:
    """A kept failure's size is its type, module and message."""
    keep = Retention(success=None, error=60.0, max_bytes=40)
    a = coordinating(directory, retention=keep)
    b = group(directory, retention=keep)
    try:
        def short() -> None:
            raise ValueError("no")  # ValueError + builtins + no: 19 bytes

        def long() -> None:
            raise ValueError("n" * 30)  # 47 bytes: over max_bytes alone

        with pytest.raises(ValueError):
            a.run_sync("short", short)
        with pytest.raises(ValueError):
            a.run_sync("long", long)
        with pytest.raises(FlightFailedError):
            b.run_sync("short", lambda: None)  # kept
        assert b.run_sync("long", lambda: "ran").value == "ran"  # not kept
    finally:
        close(a, b)


@pytest.mark.parametrize("name", ["max_items", "max_bytes"])
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", 2**63, []])
def test_a_land_with_a_bad_bound_is_answered_error(directory: str, name: str, bad: object) -> None:
    """A land with a bad max_items or max_bytes is answered error; the connection stays."""
    a = coordinating(directory)
    try:
        with RawConn(os.path.join(directory, "flight.sock")) as conn:
            assert conn.hello() == HELLO_OK
            header = {"op": "land", "id": 5, "token": 1, "outcome": "value", "keep": 1.0}
            conn.send_frame({**header, name: bad}, b"1")
            answer, _ = conn.read_frame()
            assert answer["op"] == "error" and answer["id"] == 5, answer
            assert name in answer["message"]
            conn.send_frame({"op": "status", "id": 6})  # the connection stays
            assert conn.read_frame()[0]["op"] == "status"
    finally:
        close(a)


def test_the_bounds_round_trip_and_are_optional() -> None:
    """A land's retention bounds round-trip on the wire, and are optional."""
    for outcome in (
        wire.Value(b"v", 1.0, 3, 100),
        wire.Value(b"v", 1.0, None, 100),
        wire.Failure("E", "m", "msg", 2.0, 7, None),
    ):
        frame = wire.land_frame(1, 2, outcome)
        header, payload = wire.decode_body(frame[4:])
        assert wire.parse_request(header, payload) == wire.Land(1, 2, outcome)
        fields, data = wire.outcome_fields(outcome)
        land = {"op": "land", "id": 1, "token": 2, **fields}
        assert frame == wire.encode_frame(land, data)
    header, _ = wire.decode_body(wire.land_frame(1, 2, wire.Value(b"v", 1.0))[4:])
    assert "max_items" not in header and "max_bytes" not in header
    header.update(max_items=None, max_bytes=None)  # null is absent
    assert wire.parse_request(header, b"v") == wire.Land(1, 2, wire.Value(b"v", 1.0))


def test_a_kept_failure_has_its_cause_in_the_group_that_led_it(directory: str) -> None:
    """A kept failure has its __cause__ in the group that led it."""
    g = group(directory, retention=Retention(success=None, error=60.0))
    try:
        boom = KeyError("missing")

        def work() -> None:
            raise boom

        with pytest.raises(KeyError) as led:
            g.run_sync("k", work)
        assert led.value is boom
        runs: list[int] = []
        with pytest.raises(FlightFailedError) as kept:
            g.run_sync("k", lambda: runs.append(1))
        assert runs == []  # served from the kept outcome
        assert kept.value.error_type == "KeyError"
        # API.md (Policies): "a kept failure raises FlightFailedError (with `__cause__` in
        # the leader's process), as a joiner's would" -- as the process scope does.
        assert kept.value.__cause__ is boom
    finally:
        close(g)


def test_retention_max_items_bounds_the_directorys_kept_outcomes(directory: str) -> None:
    """Retention's max_items bounds the directory's kept outcomes."""
    a, b = (group(directory, retention=Retention(success=60.0, max_items=1)) for _ in "ab")
    try:
        assert a.run_sync("k1", lambda: "one").joined is False
        assert a.run_sync("k2", lambda: "two").joined is False
        assert b.run_sync("k2", lambda: "again").value == "two"  # kept: the bound works
        # API.md: a kept outcome is served "until its time runs out or it is evicted (LRU
        # by items, then by encoded bytes)"; max_items=1 keeps only k2's.
        again = b.run_sync("k1", lambda: "new")
        assert (again.value, again.joined) == ("new", False)
    finally:
        close(a, b)
