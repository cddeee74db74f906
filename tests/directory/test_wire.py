"""The directory protocol's wire format (docs/directory-protocol.md): handshake lines, frames
over a real StreamReader, every message's round trip, and every bad field of every request."""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flightgroup.directory import wire
from flightgroup.directory.wire import (
    Ack,
    Attempt,
    BadRequest,
    Cancel,
    ErrorAnswer,
    Failure,
    Forget,
    Interrupted,
    InterruptedAnswer,
    Joined,
    Land,
    Landed,
    Lead,
    Reassert,
    Rejected,
    Run,
    Status,
    StatusAnswer,
    Taken,
    Timeout,
    Value,
    WireError,
)

from ..support import run

# Hypothesis examples run in microseconds, but a loaded CI machine must not make them flaky.
prop = settings(deadline=None)

TOP = 2**63 - 1  # the largest id or token

ids = st.integers(0, TOP)
keys = st.text(min_size=1)  # any unicode but lone surrogates: newlines, quotes, braces
texts = st.text()
positive = st.floats(min_value=1e-9, max_value=1e12, allow_nan=False, allow_infinity=False)
keeps = st.none() | positive
outcomes = st.one_of(
    st.builds(Value, st.binary(), keeps),
    st.builds(Failure, texts, texts, texts, keeps),
    st.builds(Timeout, positive),
    st.builds(Interrupted, texts),
)


def body_of(frame: bytes) -> bytes:
    """The body of one frame, after checking its length prefix."""
    (size,) = struct.unpack(">I", frame[:4])
    assert size == len(frame) - 4
    return frame[4:]


def request_of(frame: bytes) -> wire.Request:
    return wire.parse_request(*wire.decode_body(body_of(frame)))


def answer_of(frame: bytes) -> wire.Answer:
    return wire.parse_answer_frame(*wire.decode_body(body_of(frame)))


def header_bytes(header: dict[str, Any]) -> bytes:
    """A header as a peer may send it. An infinity goes out as 1e999: valid JSON that Python
    reads as inf (the constant Infinity is refused earlier, by decode_body)."""
    return json.dumps(header, separators=(",", ":")).replace("Infinity", "1e999").encode()


# ---------------------------------------------------------------------------------------------
# Handshake lines


def test_handshake_lines_are_byte_for_byte_those_of_api_md() -> None:
    assert wire.HELLO == b'{"protocol":"flightgroup","version":1}\n'
    assert wire.WELCOME == b'{"ok":true}\n'
    assert wire.refusal_line() == b'{"protocol":"flightgroup","version":1}\n'
    assert wire.refusal_line(7) == b'{"protocol":"flightgroup","version":7}\n'
    assert wire.PROTOCOL == "flightgroup" and wire.VERSION == 1
    assert wire.FIRST_LINE_LIMIT == 1024 and wire.HANDSHAKE_TIMEOUT == 3.0
    assert wire.DEFAULT_MAX_FRAME == 64 * 1024 * 1024 + 64 * 1024


@pytest.mark.parametrize(
    ("line", "version"),
    [
        (b'{"protocol":"flightgroup","version":1}\n', 1),
        (b'{"protocol":"flightgroup","version":1}', 1),
        (b'{"protocol":"flightgroup","version":2}\n', 2),
        (b'{"protocol":"flightgroup","version":0}\n', 0),
        (b'{ "version": 3, "protocol": "flightgroup", "extra": [1] }\r\n', 3),
    ],
)
def test_parse_hello_returns_the_version_a_flightgroup_hello_names(
    line: bytes, version: int
) -> None:
    assert wire.parse_hello(line) == version


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"\n",
        b"hello\n",
        b"GET / HTTP/1.1\r\n",
        b"[1, 2]\n",
        b'"flightgroup"\n',
        b"\xff\xfe\n",
        b'{"protocol":"other","version":1}\n',
        b'{"protocol":"flightgroup"}\n',
        b'{"version":1}\n',
        b'{"protocol":"flightgroup","version":true}\n',
        b'{"protocol":"flightgroup","version":"1"}\n',
        b'{"protocol":"flightgroup","version":1.0}\n',
        b'{"protocol":"flightgroup","version":NaN}\n',
        b'{"protocol":"flightgroup","version":1} junk\n',
        b"[" * 5000 + b"\n",
    ],
)
def test_parse_hello_returns_none_for_anything_else(line: bytes) -> None:
    assert wire.parse_hello(line) is None


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        (b'{"ok":true}\n', ("ok", None)),
        (b'{"protocol":"flightgroup","version":1}\n', ("version", 1)),
        (b'{"protocol":"flightgroup","version":2}\n', ("version", 2)),
        (b'{"ok":false,"error":"refused: uid 5"}\n', ("refused", "refused: uid 5")),
        (None, ("closed", None)),
        (b"", ("closed", None)),
        (b"\n", ("closed", None)),
        (b"junk\n", ("closed", None)),
        (b"\xff\n", ("closed", None)),
        (b'{"ok":1}\n', ("closed", None)),
        (b'{"protocol":"other","version":1}\n', ("closed", None)),
        (b'{"protocol":"flightgroup","version":false}\n', ("closed", None)),
        (b'{"protocol":"flightgroup","version":"2"}\n', ("closed", None)),
        (b"[true]\n", ("closed", None)),
    ],
)
def test_parse_answer_tells_served_other_version_refused_and_closed(
    line: bytes | None, answer: tuple[str, object]
) -> None:
    assert wire.parse_answer(line) == answer


def test_the_coordinators_own_lines_parse_as_what_they_mean() -> None:
    assert wire.parse_answer(wire.WELCOME) == ("ok", None)
    assert wire.parse_answer(wire.refusal_line(9)) == ("version", 9)
    assert wire.parse_hello(wire.HELLO) == wire.VERSION


@prop
@given(texts)
@example('line one\nline two "quoted" \\ \u2028 \ud800')  # a lone surrogate still encodes
def test_error_line_is_one_compact_line_that_parses_back(message: str) -> None:
    line = wire.error_line(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line.startswith(b'{"ok":false,"error":')
    assert wire.parse_answer(line) == ("refused", message)


# ---------------------------------------------------------------------------------------------
# Frames: encoding and decoding a body


def test_encode_frame_is_length_then_compact_json_then_newline_and_payload() -> None:
    # ASCII JSON: a non-ASCII character is a \u escape, so a lone surrogate encodes too.
    assert wire.encode_frame({"op": "x", "k": "é"}) == b'\x00\x00\x00\x17{"op":"x","k":"\\u00e9"}'
    lone = wire.encode_frame({"op": "x", "k": "\ud800"})
    assert wire.decode_body(lone[4:]) == ({"op": "x", "k": "\ud800"}, None)
    framed = wire.encode_frame({"op": "x"}, b"\x00\n\xff")
    assert framed == b'\x00\x00\x00\x0e{"op":"x"}\n\x00\n\xff'
    assert wire.decode_body(framed[4:]) == ({"op": "x"}, b"\x00\n\xff")


def test_an_empty_payload_is_not_no_payload() -> None:
    assert wire.decode_body(body_of(wire.encode_frame({"op": "x"}, b""))) == ({"op": "x"}, b"")
    assert wire.decode_body(body_of(wire.encode_frame({"op": "x"}))) == ({"op": "x"}, None)


def test_encode_frame_takes_any_mapping_and_refuses_what_json_cannot_carry() -> None:
    assert wire.encode_frame(MappingProxyType({"op": "x"})) == wire.encode_frame({"op": "x"})
    with pytest.raises(ValueError):
        wire.encode_frame({"op": "x", "age": float("nan")})


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\n", id="empty-header-with-payload"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
        pytest.param(b'{"op":"x",', id="cut-json"),
        pytest.param(b'{"op":"x"} {}', id="trailing-data"),
        pytest.param(b"[1,2]", id="array"),
        pytest.param(b'"run"', id="string"),
        pytest.param(b"null", id="null"),
        pytest.param(b'{"id":1}', id="no-op"),
        pytest.param(b'{"op":1}', id="int-op"),
        pytest.param(b'{"op":null}', id="null-op"),
        pytest.param(b'{"op":"x","a":NaN}', id="nan"),
        pytest.param(b'{"op":"x","a":-Infinity}', id="infinity"),
        pytest.param(b'{"op":"x","a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="deep"),
        pytest.param(b'{"op":"x","a":' + b'{"a":' * 100_000 + b"}", id="deep-objects"),
    ],
)
def test_decode_body_refuses_a_header_that_is_not_an_object_with_a_string_op(
    body: bytes,
) -> None:
    with pytest.raises(WireError):
        wire.decode_body(body)


def test_decode_body_splits_at_the_first_newline_only() -> None:
    header, payload = wire.decode_body(b'{"op":"x","s":"a\\nb"}\n\n{"op":"y"}\n')
    assert header == {"op": "x", "s": "a\nb"}
    assert payload == b'\n{"op":"y"}\n'


# ---------------------------------------------------------------------------------------------
# Frames over a real StreamReader


def reader_with(*chunks: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    if eof:
        reader.feed_eof()
    return reader


def test_read_frame_reads_two_frames_back_to_back_then_none_at_a_clean_end() -> None:
    first = wire.run_frame(1, "a")
    second = wire.landed_frame(2, 5, Value(b"v\nw"), kept=True)

    async def main() -> None:
        reader = reader_with(first + second)
        assert await wire.read_frame(reader, 1024) == ({"op": "run", "id": 1, "key": "a"}, None)
        assert await wire.read_frame(reader, 1024) == wire.decode_body(second[4:])
        assert await wire.read_frame(reader, 1024) is None
        assert await wire.read_frame(reader, 1024) is None  # and stays at the end

    run(main())


def test_read_frame_at_once_at_the_end_of_an_empty_stream_is_none() -> None:
    async def main() -> None:
        assert await wire.read_frame(reader_with(), 1024) is None

    run(main())


@prop
@given(
    st.lists(st.tuples(keys, st.binary()), min_size=1, max_size=4),
    st.lists(st.integers(1, 64), min_size=1, max_size=50),
)
def test_read_frame_reassembles_frames_fed_in_small_pieces(
    frames: list[tuple[str, bytes]], sizes: list[int]
) -> None:
    stream = b"".join(wire.land_frame(7, 9, Value(data)) for _, data in frames)
    stream += b"".join(wire.run_frame(3, key) for key, _ in frames)

    async def feeder(reader: asyncio.StreamReader) -> None:
        at, i = 0, 0
        while at < len(stream):
            size = sizes[i % len(sizes)]
            reader.feed_data(stream[at : at + size])
            at, i = at + size, i + 1
            await asyncio.sleep(0)  # a yield, so the reader sees each piece on its own
        reader.feed_eof()

    async def main() -> list[tuple[dict[str, Any], bytes | None]]:
        reader = asyncio.StreamReader()
        feeding = asyncio.create_task(feeder(reader))
        got = []
        while (frame := await wire.read_frame(reader, wire.DEFAULT_MAX_FRAME)) is not None:
            got.append(frame)
        await feeding
        return got

    got = run(main())
    assert [(h["op"], p) for h, p in got[: len(frames)]] == [("land", d) for _, d in frames]
    assert [h["key"] for h, _ in got[len(frames) :]] == [k for k, _ in frames]


def test_read_frame_one_byte_at_a_time_waits_for_the_last_byte() -> None:
    frame = wire.status_answer_frame(4, [{"key": "k", "token": 1}])

    async def main() -> None:
        reader = asyncio.StreamReader()
        reading = asyncio.create_task(wire.read_frame(reader, 1024))
        for byte in frame[:-1]:
            reader.feed_data(bytes([byte]))
            await asyncio.sleep(0)
            assert not reading.done()
        reader.feed_data(frame[-1:])
        assert await reading == wire.decode_body(frame[4:])

    run(main())


def test_read_frame_refuses_an_oversized_length_without_reading_the_body() -> None:
    async def main() -> None:
        # No body and no end of stream: a reader that waited for the body would hang here.
        reader = reader_with(struct.pack(">I", 1001) + b"xyz", eof=False)
        with pytest.raises(WireError, match="1001"):
            await wire.read_frame(reader, 1000)
        assert await reader.readexactly(3) == b"xyz"  # the body was left alone

    run(main())


def test_read_frame_takes_a_frame_of_exactly_max_frame_bytes() -> None:
    frame = wire.encode_frame({"op": "x"}, b"p" * 100)

    async def main() -> None:
        assert await wire.read_frame(reader_with(frame), len(frame) - 4) is not None
        with pytest.raises(WireError):
            await wire.read_frame(reader_with(frame), len(frame) - 5)

    run(main())


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(b"\x00\x00", id="inside-the-length"),
        pytest.param(b"\x00\x00\x00\x10" + b'{"op":"x"}', id="inside-the-body"),
        pytest.param(wire.run_frame(1, "k")[:-1], id="one-byte-short"),
    ],
)
def test_read_frame_refuses_a_stream_that_ends_inside_a_frame(stream: bytes) -> None:
    async def main() -> None:
        with pytest.raises(WireError, match="ended inside"):
            await wire.read_frame(reader_with(stream), 1024)

    run(main())


def test_read_frame_refuses_a_body_that_does_not_parse() -> None:
    async def main() -> None:
        with pytest.raises(WireError):
            await wire.read_frame(reader_with(b"\x00\x00\x00\x02[]"), 1024)
        with pytest.raises(WireError):
            await wire.read_frame(reader_with(b"\x00\x00\x00\x00"), 1024)

    run(main())


def test_read_line_leaves_the_bytes_after_the_newline_for_read_frame() -> None:
    frame = wire.run_frame(1, "k", fresh=True)

    async def main() -> None:
        reader = reader_with(wire.HELLO + frame + wire.ack_frame(1))
        assert await wire.read_line(reader) == wire.HELLO
        assert await wire.read_frame(reader, 1024) == wire.decode_body(frame[4:])
        assert await wire.read_frame(reader, 1024) == ({"op": "ack", "id": 1}, None)

    run(main())


def test_read_line_waits_for_a_line_fed_in_pieces() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reading = asyncio.create_task(wire.read_line(reader))
        for byte in wire.HELLO[:-1]:
            reader.feed_data(bytes([byte]))
            await asyncio.sleep(0)
            assert not reading.done()
        reader.feed_data(b"\n{")
        assert await reading == wire.HELLO
        reader.feed_eof()
        assert await reader.read() == b"{"  # the rest is the frame reader's

    run(main())


def test_read_line_takes_exactly_the_limit_and_refuses_one_byte_more() -> None:
    async def main() -> None:
        line = b"a" * wire.FIRST_LINE_LIMIT + b"\n"
        assert await wire.read_line(reader_with(line)) == line
        assert await wire.read_line(reader_with(b"a" + line)) is None
        assert await wire.read_line(reader_with(b"abc\n"), limit=3) == b"abc\n"
        assert await wire.read_line(reader_with(b"abcd\n"), limit=3) is None

    run(main())


@pytest.mark.parametrize(
    "stream",
    [pytest.param(b"", id="nothing"), pytest.param(b'{"protocol":"flightgroup"', id="no-newline")],
)
def test_read_line_returns_none_when_the_stream_ends_before_a_newline(stream: bytes) -> None:
    async def main() -> None:
        assert await wire.read_line(reader_with(stream)) is None

    run(main())


def test_read_line_returns_none_over_the_streams_own_smaller_limit() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader(limit=16)
        reader.feed_data(b"x" * 40 + b"\n")
        assert await wire.read_line(reader) is None

    run(main())


# ---------------------------------------------------------------------------------------------
# Round trips of every message


@prop
@given(ids, keys, st.booleans(), st.none() | ids, st.none() | ids)
@example(TOP, 'k"\n\\{}\x00\u2028é😀', True, TOP, TOP)
@example(0, "\n", False, 0, None)
def test_run_round_trips_and_matches_the_generic_encoder(
    id: int, key: str, fresh: bool, flight: int | None, after: int | None
) -> None:
    frame = wire.run_frame(id, key, fresh=fresh, flight=flight, after=after)
    sent_after = after if fresh else None  # only a fresh run names a flight to come after
    assert request_of(frame) == Run(id, key, fresh, flight, after=sent_after)
    header: dict[str, Any] = {"op": "run", "id": id, "key": key}
    if fresh:
        header["fresh"] = True
        if after is not None:
            header["after"] = after
    if flight is not None:
        header["flight"] = flight
    assert frame == wire.encode_frame(header)  # the template is the encoder, byte for byte
    assert b"\n" not in body_of(frame)  # no raw newline in a header, whatever the key


earliers = st.lists(ids, max_size=wire.MAX_EARLIER)


@prop
@given(ids, keys, ids, earliers)
@example(TOP, 'k"\n', TOP, [TOP] * wire.MAX_EARLIER)
@example(0, "k", 0, [0])
def test_a_rejoin_with_earlier_tokens_round_trips_and_matches_the_generic_encoder(
    id: int, key: str, flight: int, earlier: list[int]
) -> None:
    frame = wire.run_frame(id, key, flight=flight, earlier=earlier)
    assert request_of(frame) == Run(id, key, False, flight, tuple(earlier))
    header: dict[str, Any] = {"op": "run", "id": id, "key": key, "flight": flight}
    if earlier:
        header["earlier"] = earlier
    assert frame == wire.encode_frame(header)


@prop
@given(ids, keys, ids, earliers)
@example(TOP, '"', TOP, [TOP] * wire.MAX_EARLIER)
def test_a_reassert_with_earlier_tokens_round_trips(
    id: int, key: str, token: int, earlier: list[int]
) -> None:
    frame = wire.reassert_frame(id, key, token, earlier)
    assert request_of(frame) == Reassert(id, key, token, tuple(earlier))
    if not earlier:  # no field at all: the frame an older peer of version 1 sends
        assert frame == wire.encode_frame({"op": "reassert", "id": id, "key": key, "token": token})


def test_builders_refuse_more_earlier_tokens_than_a_frame_may_hold() -> None:
    too_many = list(range(wire.MAX_EARLIER + 1))
    with pytest.raises(ValueError):
        wire.run_frame(1, "k", flight=2, earlier=too_many)
    with pytest.raises(ValueError):
        wire.reassert_frame(1, "k", 2, too_many)


@prop
@given(ids, ids, outcomes)
@example(TOP, TOP, Value(b"\n", None))
@example(0, 0, Value(b"", 1.0))
def test_land_round_trips_with_any_outcome(id: int, token: int, outcome: wire.Outcome) -> None:
    assert request_of(wire.land_frame(id, token, outcome)) == Land(id, token, outcome)


@prop
@given(ids, ids, outcomes, st.booleans())
def test_landed_round_trips_with_any_outcome(
    id: int, token: int, outcome: wire.Outcome, kept: bool
) -> None:
    assert answer_of(wire.landed_frame(id, token, outcome, kept)) == Landed(
        id, token, outcome, kept
    )


@prop
@given(ids, ids, outcomes, st.booleans())
@example(TOP, TOP, Value(b"\n", 1e-9), True)
def test_land_and_landed_templates_are_the_generic_encoder_byte_for_byte(
    id: int, token: int, outcome: wire.Outcome, kept: bool
) -> None:
    fields, payload = wire.outcome_fields(outcome)
    land = {"op": "land", "id": id, "token": token, **fields}
    assert wire.land_frame(id, token, outcome) == wire.encode_frame(land, payload)
    landed = {"op": "landed", "id": id, "token": token, **fields, "kept": kept}
    assert wire.landed_frame(id, token, outcome, kept) == wire.encode_frame(landed, payload)


@prop
@given(ids, ids, outcomes)
@example(TOP, TOP, Value(b"\n", 1.0))
def test_a_land_that_asks_for_taken_round_trips_and_its_answer_too(
    id: int, token: int, outcome: wire.Outcome
) -> None:
    """A land with ``"taken":true`` says so (the generic encoder's bytes), and ``taken``
    round trips."""
    frame = wire.land_frame(id, token, outcome, taken=True)
    assert request_of(frame) == Land(id, token, outcome, taken=True)
    fields, payload = wire.outcome_fields(outcome)
    land = {"op": "land", "id": id, "token": token, **fields, "taken": True}
    assert frame == wire.encode_frame(land, payload)
    assert answer_of(wire.taken_frame(id)) == Taken(id)
    assert wire.taken_frame(id) == wire.encode_frame({"op": "taken", "id": id})


def test_builders_refuse_numbers_json_cannot_carry() -> None:
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError):
            wire.joined_frame(1, 2, 3, bad)
        with pytest.raises(ValueError):
            wire.landed_frame(1, 2, Value(b"", bad))
        with pytest.raises(ValueError):
            wire.land_frame(1, 2, Value(b"", bad))
        with pytest.raises(ValueError):
            wire.land_frame(1, 2, Timeout(bad))


def test_landed_of_a_value_is_header_newline_payload_in_one_frame() -> None:
    frame = wire.landed_frame(1, 2, Value(b"\x00\nend", 30.0), kept=True)
    assert frame[4:] == (
        b'{"op":"landed","id":1,"token":2,"outcome":"value","keep":30.0,"kept":true}\n\x00\nend'
    )


@prop
@given(ids, keys, ids)
@example(TOP, '"', TOP)
def test_reassert_and_forget_round_trip(id: int, key: str, token: int) -> None:
    assert request_of(wire.reassert_frame(id, key, token)) == Reassert(id, key, token)
    assert request_of(wire.forget_frame(key)) == Forget(key)


@prop
@given(ids)
@example(TOP)
def test_id_only_requests_round_trip_and_match_the_generic_encoder(id: int) -> None:
    for build, op, request in [
        (wire.attempt_frame, "attempt", Attempt(id)),
        (wire.cancel_frame, "cancel", Cancel(id)),
        (wire.status_frame, "status", Status(id)),
    ]:
        assert request_of(build(id)) == request
        assert build(id) == wire.encode_frame({"op": op, "id": id})


@prop
@given(ids, ids, st.integers(0, 2**31), st.floats(0, 1e9))
@example(TOP, TOP, 0, 0.0)
def test_lead_joined_and_ack_round_trip(id: int, token: int, pid: int, age: float) -> None:
    assert answer_of(wire.lead_frame(id, token)) == Lead(id, token)
    assert wire.lead_frame(id, token) == wire.encode_frame({"op": "lead", "id": id, "token": token})
    assert answer_of(wire.joined_frame(id, token, pid, age)) == Joined(id, token, pid, age)
    joined = {"op": "joined", "id": id, "token": token, "pid": pid, "age": age}
    assert wire.joined_frame(id, token, pid, age) == wire.encode_frame(joined)
    assert answer_of(wire.ack_frame(id)) == Ack(id)
    assert wire.ack_frame(id) == wire.encode_frame({"op": "ack", "id": id})


@prop
@given(ids, texts)
def test_reason_and_message_answers_round_trip(id: int, text: str) -> None:
    assert answer_of(wire.interrupted_frame(id, text)) == InterruptedAnswer(id, text)
    assert answer_of(wire.rejected_frame(id, text)) == Rejected(id, text)
    assert answer_of(wire.error_frame(id, text)) == ErrorAnswer(id, text)
    assert answer_of(wire.error_frame(None, text)) == ErrorAnswer(None, text)


@prop
@given(
    ids,
    st.lists(
        st.fixed_dictionaries(
            {"key": keys, "token": ids, "leader_pid": st.integers(0, 2**22)},
            optional={"joiners": st.integers(0, 100), "age_s": st.floats(0, 1e6)},
        ),
        max_size=5,
    ),
)
def test_status_answer_round_trips(id: int, flights: list[dict[str, Any]]) -> None:
    assert answer_of(wire.status_answer_frame(id, flights)) == StatusAnswer(id, flights)


def test_joined_age_may_be_an_integer_on_the_wire() -> None:
    body = b'{"op":"joined","id":1,"token":2,"pid":3,"age":4}'
    answer = wire.parse_answer_frame(*wire.decode_body(body))
    assert answer == Joined(1, 2, 3, 4.0) and isinstance(answer, Joined)
    assert type(answer.age) is float


def test_outcome_fields_and_parse_outcome_are_inverse() -> None:
    examples: list[wire.Outcome] = [
        Value(b"x", None),
        Value(b"", 2.5),
        Failure("ValueError", "builtins", "bad", None),
        Failure("E", "m", "", 1.0),
        Timeout(0.5),
        Interrupted("lease lost"),
    ]
    for outcome in examples:
        fields, payload = wire.outcome_fields(outcome)
        assert wire.parse_outcome({"op": "landed", **fields}, payload) == outcome


def test_outcome_fields_refuses_what_is_not_an_outcome() -> None:
    with pytest.raises(TypeError):
        wire.outcome_fields("value")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Requests: unknown fields are ignored, bad ones answered with an error


def parse(header: dict[str, Any], payload: bytes | None = None) -> wire.Request:
    # Through the bytes, as the coordinator sees it: a JSON number like 1e999 becomes inf there.
    body = header_bytes(header) if payload is None else header_bytes(header) + b"\n" + payload
    return wire.parse_request(*wire.decode_body(body))


def test_unknown_fields_and_unused_payloads_are_ignored() -> None:
    assert parse({"op": "run", "id": 1, "key": "k", "later": {"x": 1}}, b"p") == Run(1, "k")
    assert parse({"op": "cancel", "id": 2, "key": 5}) == Cancel(2)
    land = {"op": "land", "id": 1, "token": 2, "outcome": "interrupted", "reason": "r", "keep": 5}
    assert parse(land, b"ignored") == Land(1, 2, Interrupted("r"))


def test_null_optional_fields_are_their_defaults() -> None:
    assert parse({"op": "run", "id": 1, "key": "k", "fresh": None, "flight": None}) == Run(1, "k")
    run_header = {"op": "run", "id": 1, "key": "k", "flight": 2, "earlier": None}
    assert parse(run_header) == Run(1, "k", flight=2)
    reassert = {"op": "reassert", "id": 1, "key": "k", "token": 2, "earlier": None}
    assert parse(reassert) == Reassert(1, "k", 2)
    assert parse({**reassert, "earlier": []}) == Reassert(1, "k", 2)
    land = {"op": "land", "id": 1, "token": 2, "outcome": "value", "keep": None}
    assert parse(land, b"") == Land(1, 2, Value(b"", None))


def test_an_integer_keep_or_deadline_is_a_float() -> None:
    land = {"op": "land", "id": 1, "token": 2, "outcome": "value", "keep": 30}
    request = parse(land, b"v")
    assert request == Land(1, 2, Value(b"v", 30.0))
    assert isinstance(request, Land) and isinstance(request.outcome, Value)
    assert type(request.outcome.keep) is float


def test_an_unknown_op_is_a_bad_request_with_the_id() -> None:
    with pytest.raises(BadRequest) as caught:
        parse({"op": "x", "id": 5})
    assert caught.value.id == 5 and caught.value.message == "unknown op 'x'"
    assert str(caught.value) == "unknown op 'x'"
    with pytest.raises(BadRequest) as caught:
        parse({"op": "lead", "id": 5, "token": 1})  # an answer is not a request
    assert caught.value.id == 5


Header = dict[str, Any]

RUN: Header = {"op": "run", "id": 1, "key": "k"}
LAND: Header = {"op": "land", "id": 1, "token": 2, "outcome": "timeout", "deadline": 1.5}
ERR: Header = {"type": "E", "module": "m", "message": "s"}
LAND_ERROR: Header = {"op": "land", "id": 1, "token": 2, "outcome": "error", "error": ERR}
LAND_VALUE: Header = {"op": "land", "id": 1, "token": 2, "outcome": "value"}
BAD_IDS: list[Any] = [None, "1", 1.0, True, False, -1, 2**63, [1]]


def without(header: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in header.items() if k != name}


def bad_requests() -> list[Any]:
    cases: list[Any] = []

    def case(header: dict[str, Any], field: str, payload: bytes | None = None) -> None:
        name = f"{header['op']}-{field}-{json.dumps(header.get(field, 'missing'))[:20]}"
        cases.append(pytest.param(header, payload, field, id=name))

    requests: dict[str, Header] = {
        "run": RUN,
        "land": LAND,
        "attempt": {"op": "attempt", "id": 1},
        "cancel": {"op": "cancel", "id": 1},
        "reassert": {"op": "reassert", "id": 1, "key": "k", "token": 2},
        "status": {"op": "status", "id": 1},
    }
    value: Any
    for header in requests.values():
        case(without(header, "id"), "id")
        for value in BAD_IDS:
            case({**header, "id": value}, "id")
    for header in (RUN, requests["reassert"], {"op": "forget", "key": "k"}):
        case(without(header, "key"), "key")
        for value in ["", 5, None, ["k"], True]:
            case({**header, "key": value}, "key")
    for value in ["yes", 1, 0, [True]]:
        case({**RUN, "fresh": value}, "fresh")
    for value in ["t", True, -1, 2**63, 1.5]:
        case({**RUN, "flight": value}, "flight")
        case({**RUN, "fresh": True, "after": value}, "after")
    case({**RUN, "after": 5}, "after")  # after without fresh: nothing to come after
    case({**RUN, "fresh": False, "after": 5}, "after")
    bad_earlier: list[Any] = [
        5, "1", True, {"0": 1}, [True], [False], [-1], [2**63], [1.0], ["1"], [None], [[1]],
        [1, 2, -3], list(range(wire.MAX_EARLIER + 1)),
    ]  # fmt: skip
    for header in ({**RUN, "flight": 2}, RUN, requests["reassert"]):
        for value in bad_earlier:
            case({**header, "earlier": value}, "earlier")
    for header in (LAND, requests["reassert"]):
        case(without(header, "token"), "token")
        for value in BAD_IDS:
            case({**header, "token": value}, "token")
    case(without(LAND, "outcome"), "outcome")
    for value in ["weird", None, 1, "VALUE"]:
        case({**LAND, "outcome": value}, "outcome")
    case(LAND_VALUE, "payload")  # a value needs its payload
    case(without(LAND_ERROR, "error"), "error")
    for value in ["boom", None, ["E", "m", "s"]]:
        case({**LAND_ERROR, "error": value}, "error")
    for part in ("type", "module", "message"):
        case({**LAND_ERROR, "error": without(ERR, part)}, part)
        case({**LAND_ERROR, "error": {**ERR, part: 1}}, part)
    case(without(LAND, "deadline"), "deadline")
    for value in [0, -1.5, "1", True, None, 1e999, -1e999]:
        case({**LAND, "deadline": value}, "deadline")
    interrupted: Header = {**without(LAND, "deadline"), "outcome": "interrupted", "reason": "r"}
    case(without(interrupted, "reason"), "reason")
    for value in [1, None, ["r"]]:
        case({**interrupted, "reason": value}, "reason")
    for header, payload in ((LAND_VALUE, b"v"), (LAND_ERROR, None)):
        for value in [0, -1, "5", True, 1e999, [5]]:
            case({**header, "keep": value}, "keep", payload)
    return cases


@pytest.mark.parametrize(("header", "payload", "field"), bad_requests())
def test_every_bad_field_of_every_request_is_a_bad_request_naming_it(
    header: dict[str, Any], payload: bytes | None, field: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        parse(header, payload)
    request_id = header.get("id")
    assert caught.value.id == (request_id if type(request_id) is int else None)
    assert field in caught.value.message


def test_a_bad_request_message_does_not_echo_a_huge_field() -> None:
    with pytest.raises(BadRequest) as caught:
        parse({**RUN, "fresh": "x" * 100_000})
    assert len(caught.value.message) < 200


def test_parse_outcome_raises_bad_request_with_the_id() -> None:
    with pytest.raises(BadRequest) as caught:
        wire.parse_outcome({"op": "land", "id": 8, "outcome": "value"}, None)
    assert caught.value.id == 8 and "payload" in caught.value.message
    with pytest.raises(BadRequest) as caught:
        wire.parse_outcome({"op": "land", "outcome": "timeout", "deadline": float("nan")}, None)
    assert caught.value.id is None and "deadline" in caught.value.message


# ---------------------------------------------------------------------------------------------
# Answers: anything malformed is a WireError (the client closes and reconnects)


@pytest.mark.parametrize(
    "header",
    [
        {"op": "run", "id": 1, "key": "k"},  # a request is not an answer
        {"op": "lead", "id": 1},
        {"op": "lead", "id": -1, "token": 2},
        {"op": "lead", "id": 1, "token": True},
        {"op": "joined", "id": 1, "token": 2, "age": 0.5},
        {"op": "joined", "id": 1, "token": 2, "pid": True, "age": 0.5},
        {"op": "joined", "id": 1, "token": 2, "pid": -3, "age": 0.5},
        {"op": "joined", "id": 1, "token": 2, "pid": 3, "age": -0.5},
        {"op": "joined", "id": 1, "token": 2, "pid": 3, "age": "0"},
        {"op": "joined", "id": 1, "token": 2, "pid": 3, "age": 1e999},
        {"op": "landed", "id": 1, "token": 2, "outcome": "value"},  # no payload
        {"op": "landed", "id": 1, "token": 2, "outcome": "timeout", "deadline": 1, "kept": 1},
        {"op": "landed", "id": 1, "token": 2, "outcome": "nope"},
        {"op": "interrupted", "id": 1},
        {"op": "ack"},
        {"op": "rejected", "id": 1, "reason": 5},
        {"op": "status", "id": 1, "flights": {}},
        {"op": "status", "id": 1, "flights": [1]},
        {"op": "status", "id": 1},
        {"op": "error", "id": "1", "message": "m"},
        {"op": "error", "id": 1},
    ],
    ids=lambda header: json.dumps(header)[:60],
)
def test_a_malformed_answer_is_a_wire_error(header: dict[str, Any]) -> None:
    with pytest.raises(WireError):
        wire.parse_answer_frame(*wire.decode_body(header_bytes(header)))


def test_landed_without_kept_is_not_kept() -> None:
    body = b'{"op":"landed","id":1,"token":2,"outcome":"interrupted","reason":"r"}'
    answer = wire.parse_answer_frame(*wire.decode_body(body))
    assert answer == Landed(1, 2, Interrupted("r"), False)


def test_an_error_answer_for_a_request_without_an_id_has_id_none() -> None:
    answer = wire.parse_answer_frame(*wire.decode_body(body_of(wire.error_frame(None, "m"))))
    assert answer == ErrorAnswer(None, "m")
    assert body_of(wire.error_frame(None, "m")) == b'{"op":"error","id":null,"message":"m"}'


# -- the client's splitter skips an answer over its limit ------------------------------------

_SMALL_LIMIT = 256


def _answers() -> st.SearchStrategy[tuple[bytes, dict[str, Any]]]:
    """An answer frame and what a skipping splitter with _SMALL_LIMIT yields for it."""
    ids = st.integers(min_value=0, max_value=2**40)
    value = st.builds(
        lambda id, token, data: (
            wire.landed_frame(id, token, Value(data)),
            {"op": "landed", "id": id, "token": token, "size": len(data), "data": data},
        ),
        ids, ids, st.binary(max_size=2 * _SMALL_LIMIT),
    )
    ack = st.builds(lambda id: (wire.ack_frame(id), {"op": "ack", "id": id}), ids)
    failure = st.builds(
        lambda id, message: (
            wire.landed_frame(id, 7, Failure("E", "m", message)),
            {"op": "landed", "id": id, "token": 7, "message": message},
        ),
        ids, st.text(max_size=2 * _SMALL_LIMIT),
    )
    return st.one_of(value, ack, failure)


def _expected(frame: bytes, answer: dict[str, Any]) -> dict[str, Any]:
    if len(frame) - 4 <= _SMALL_LIMIT:
        return answer
    # The size named is the payload's (a value's bytes), else the body's (a failure).
    size = answer["size"] if "size" in answer else len(frame) - 4
    return {"op": wire.SKIPPED, "of": answer["op"], "id": answer["id"], "size": size}


def _seen(header: dict[str, Any], payload: bytes | None) -> dict[str, Any]:
    if header["op"] == wire.SKIPPED:
        return {k: header[k] for k in ("op", "of", "id", "size")}
    if header["op"] == "ack":
        return {"op": "ack", "id": header["id"]}
    if header.get("outcome") == "value":
        assert payload is not None
        return {"op": "landed", "id": header["id"], "token": header["token"],
                "size": len(payload), "data": payload}
    return {"op": "landed", "id": header["id"], "token": header["token"],
            "message": header["error"]["message"]}


@settings(max_examples=300, deadline=None)
@given(
    answers=st.lists(_answers(), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4096), max_size=12),
)
def test_a_skipping_splitter_skips_answers_over_its_limit_in_any_chunks(
    answers: list[tuple[bytes, dict[str, Any]]], cuts: list[int]
) -> None:
    stream = b"".join(frame for frame, _ in answers)
    splitter = wire.FrameSplitter(_SMALL_LIMIT, skip_over=True)
    got: list[dict[str, Any]] = []
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    for a, b in itertools.pairwise(bounds):
        got += [_seen(h, p) for h, p in splitter.feed(stream[a:b])]
    assert got == [_expected(frame, answer) for frame, answer in answers]
    assert splitter.pending == 0
    # Without skip_over, the first answer over the limit closes the connection.
    if any(len(frame) - 4 > _SMALL_LIMIT for frame, _ in answers):
        with pytest.raises(wire.FrameTooLarge):
            wire.FrameSplitter(_SMALL_LIMIT).feed(stream)


def test_a_skipped_answer_says_its_payloads_size() -> None:
    frame = wire.landed_frame(3, 9, Value(b"v" * 1000))
    (header, payload), = wire.FrameSplitter(_SMALL_LIMIT, skip_over=True).feed(frame)
    assert (header, payload) == ({"op": wire.SKIPPED, "of": "landed", "id": 3, "size": 1000},
                                 None)


def test_a_skipping_splitter_still_refuses_a_frame_over_its_limit_that_is_no_answer() -> None:
    splitter = wire.FrameSplitter(_SMALL_LIMIT, skip_over=True)
    body = b'{"id":3,"op":"landed"}\n' + b"v" * 1000  # not how this protocol's answers begin
    with pytest.raises(wire.FrameTooLarge):
        splitter.feed(struct.pack(">I", len(body)) + body)
    # Its header is waited for (up to its newline, or the body's first 4 KiB): a
    # length and a beginning raise nothing yet.
    splitter = wire.FrameSplitter(_SMALL_LIMIT, skip_over=True)
    assert splitter.feed(struct.pack(">I", 10_000) + b'{"op":') == []
    assert splitter.feed(b"x" * 4000) == []
    with pytest.raises(wire.FrameTooLarge):
        splitter.feed(b"x" * 100)


def test_a_skipped_answer_cut_inside_its_header_still_says_its_payloads_size() -> None:
    # Retention bounds make the header longer than the 64 bytes the op and id come in.
    value = Value(b"v" * 1000, keep=30.5, max_items=10_000, max_bytes=1 << 30)
    frame = wire.landed_frame(3, 9, value, kept=True)
    assert frame.index(b"\n") > 4 + 64
    head_end = frame.index(b"\n")
    for cut in range(5, head_end + 2):
        splitter = wire.FrameSplitter(_SMALL_LIMIT, skip_over=True)
        got = splitter.feed(frame[:cut]) + splitter.feed(frame[cut:])
        assert got == [({"op": wire.SKIPPED, "of": "landed", "id": 3, "size": 1000}, None)]
        assert splitter.pending == 0
