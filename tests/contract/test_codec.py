"""Codecs: the shipped ones, and a codec given to a process-scope group (every
caller gets decode(encode(value)), as in the wider scopes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flightgroup import JSON, PICKLE, FlightFailedError, FlightGroup, ValueTooLargeError

from ..support import run, until


def test_json_round_trip_turns_tuples_into_lists_and_refuses_nan() -> None:
    assert JSON.decode(JSON.encode({"a": (1, 2), "b": "é"})) == {"a": [1, 2], "b": "é"}
    with pytest.raises(ValueError):
        JSON.encode(float("nan"))
    with pytest.raises(TypeError):
        JSON.encode(object())


def test_pickle_round_trip_keeps_python_objects() -> None:
    value = {"t": (1, 2), "s": {3}}
    assert PICKLE.decode(PICKLE.encode(value)) == value


class Doubling:
    """A codec whose decode is observable: every caller decodes for itself."""

    def __init__(self) -> None:
        self.decodes = 0

    def encode(self, value: Any) -> str:
        return str(value)

    def decode(self, data: bytes) -> Any:
        self.decodes += 1
        if data == b"poison":
            raise ValueError("cannot decode")
        return data.decode() * 2


def test_with_a_codec_every_caller_leader_too_gets_decode_of_encode() -> None:
    codec = Doubling()
    g = FlightGroup(codec=codec)

    async def main() -> None:
        release = asyncio.Event()

        async def work() -> int:
            await release.wait()
            return 21

        leader = asyncio.create_task(g.run("k", work))
        joiners = [asyncio.create_task(g.run("k", work)) for _ in range(3)]
        await until(lambda: g.stats().joins == 3)
        release.set()
        results = [await leader, *await asyncio.gather(*joiners)]
        assert [r.value for r in results] == ["2121"] * 4
        assert codec.decodes == 4

    run(main())


def test_encode_failure_fails_the_flight_leader_gets_the_encode_error() -> None:
    g = FlightGroup(codec=JSON)

    async def main() -> None:
        release = asyncio.Event()

        async def work() -> object:
            await release.wait()
            return object()  # JSON cannot encode it

        leader = asyncio.create_task(g.run("k", work))
        joiner = asyncio.create_task(g.run("k", work))
        await until(lambda: g.stats().joins == 1)
        release.set()
        with pytest.raises(TypeError):
            await leader
        with pytest.raises(FlightFailedError) as info:
            await joiner
        assert info.value.error_type == "TypeError"
        assert g.stats().failures == 1

    run(main())


def test_value_over_max_value_bytes_fails_with_value_too_large() -> None:
    g = FlightGroup(codec=JSON, max_value_bytes=10)

    async def main() -> None:
        release = asyncio.Event()

        async def work() -> str:
            await release.wait()
            return "x" * 100

        leader = asyncio.create_task(g.run("k", work))
        joiner = asyncio.create_task(g.run("k", work))
        await until(lambda: g.stats().joins == 1)
        release.set()
        with pytest.raises(ValueTooLargeError) as info:
            await leader
        assert (info.value.size, info.value.limit) == (102, 10)
        with pytest.raises(FlightFailedError) as failed:
            await joiner
        assert failed.value.error_type == "ValueTooLargeError"

    run(main())


def test_a_decode_failure_fails_only_that_caller() -> None:
    codec = Doubling()
    g = FlightGroup(codec=codec)
    with pytest.raises(ValueError, match="cannot decode"):
        g.run_sync("k", lambda: "poison")
    assert g.run_sync("k", lambda: "ok").value == "okok"


def test_an_operations_codec_overrides_the_groups_for_that_operation_only() -> None:
    """coalesce(codec=) encodes and decodes that operation's flights; the group's codec
    still serves plain calls and the other operations."""
    group_codec, op_codec = Doubling(), Doubling()
    g = FlightGroup(codec=group_codec)

    @g.coalesce(codec=op_codec)
    def own() -> str:
        return "a"

    @g.coalesce()
    def shared() -> str:
        return "b"

    assert own() == "aa"
    assert op_codec.decodes == 1 and group_codec.decodes == 0
    assert shared() == "bb"
    assert g.run_sync("k", lambda: "c").value == "cc"
    assert (op_codec.decodes, group_codec.decodes) == (1, 2)


def test_an_operations_codec_in_a_process_group_without_one_gives_decode_of_encode() -> None:
    """In the process scope without a group codec, an operation's codec still makes every
    caller, the leader too, get decode(encode(value)); plain calls share the object."""
    g = FlightGroup()
    value = (1, 2)

    @g.coalesce(codec=JSON)
    def pair() -> Any:
        return value

    assert pair() == [1, 2]
    assert g.run_sync("k", lambda: value).value is value


def test_an_operations_codec_in_the_wrong_shape_is_refused_at_decoration() -> None:
    """coalesce(codec=) checks the codec as the group does: a TypeError, nothing made."""
    g = FlightGroup()
    with pytest.raises(TypeError, match="codec"):
        g.coalesce(codec=object())  # type: ignore[arg-type]


def test_an_operations_encode_failure_fails_its_joiners_with_flight_failed() -> None:
    """The operation's codec's encode error: the leader gets it, its joiner
    FlightFailedError, as for a group's codec."""
    g = FlightGroup()

    async def main() -> None:
        release = asyncio.Event()

        @g.coalesce(key=lambda: "k", codec=JSON)
        async def unencodable() -> object:
            await release.wait()
            return object()

        leader = asyncio.create_task(unencodable())
        await until(lambda: g.stats().calls == 1)
        joiner = asyncio.create_task(unencodable())
        await until(lambda: g.stats().joins == 1)
        release.set()
        with pytest.raises(TypeError):
            await leader
        with pytest.raises(FlightFailedError) as info:
            await joiner
        assert info.value.error_type == "TypeError"

    run(main())
