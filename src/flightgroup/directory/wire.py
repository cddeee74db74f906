"""The directory protocol's wire format: handshake lines, frames, and the messages they carry.

``docs/directory-protocol.md`` is the spec; this module is its only code. It does no I/O of its
own beyond reading from an :class:`asyncio.StreamReader`, holds no state, and imports nothing
from the rest of flightgroup but the scope-neutral outcomes it carries
(:mod:`flightgroup.scope.outcome`), so the coordinator and the client both build on it.

Design note:

- **Two kinds of peer error.** :class:`WireError` means the byte stream itself is broken (a
  length over the limit, a body that is not a JSON object with a string ``op``, a stream cut
  short): nothing after it can be trusted, so the connection closes. :class:`BadRequest` means
  a well-formed frame asked for something the coordinator does not understand: the stream is
  still in step, so the coordinator answers ``error`` and keeps the connection. On the client
  side every malformed answer is a :class:`WireError`: a coordinator that says nonsense is
  closed and reconnected to, never argued with.
- **Strict on what matters, lenient on the rest.** Ids and tokens are range-checked because
  they index tables on the other side; fields this version does not know are ignored, so a
  later version may add some without a new protocol version.
- **Cheap builders.** Every message is one small JSON header; a value's payload is appended as
  it is, never re-encoded, and each frame is one ``bytes`` so a caller writes it in one call.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias

from ..scope.outcome import Failure, Interrupted, SharedOutcome, Timeout, Value

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FIRST_LINE_LIMIT",
    "HANDSHAKE_TIMEOUT",
    "HELLO",
    "MAX_EARLIER",
    "PROTOCOL",
    "VERSION",
    "WELCOME",
    "Ack",
    "Answer",
    "Attempt",
    "BadRequest",
    "Cancel",
    "Detached",
    "ErrorAnswer",
    "Forget",
    "FrameTooLarge",
    "InterruptedAnswer",
    "Joined",
    "Land",
    "Landed",
    "Lead",
    "Reassert",
    "Rejected",
    "Request",
    "Run",
    "Status",
    "StatusAnswer",
    "WireError",
    "ack_frame",
    "attempt_frame",
    "cancel_frame",
    "decode_body",
    "detached_frame",
    "encode_frame",
    "error_frame",
    "error_line",
    "forget_frame",
    "interrupted_frame",
    "joined_frame",
    "land_frame",
    "landed_frame",
    "lead_frame",
    "outcome_fields",
    "parse_answer",
    "parse_answer_frame",
    "parse_hello",
    "parse_outcome",
    "parse_request",
    "read_frame",
    "read_line",
    "reassert_frame",
    "refusal_line",
    "rejected_frame",
    "run_frame",
    "status_answer_frame",
    "status_frame",
]

PROTOCOL = "flightgroup"
"""The protocol name a hello and a version refusal carry."""

VERSION = 1
"""The protocol version this module speaks."""

HELLO: bytes = b'{"protocol":"flightgroup","version":1}\n'
"""The client's first line, byte for byte as API.md fixes it."""

WELCOME: bytes = b'{"ok":true}\n'
"""The coordinator's answer to a hello of its own version."""

FIRST_LINE_LIMIT = 1024
"""The most bytes a handshake line may hold before its newline."""

HANDSHAKE_TIMEOUT = 3.0
"""Seconds the coordinator waits for a client's hello."""

DEFAULT_MAX_FRAME = 64 * 1024 * 1024 + 64 * 1024
"""The default largest frame body (``max_frame_bytes``): 64 MiB of value plus room for a header."""

READ_SIZE = 256 * 1024
"""Bytes a peer reads from its socket at most at once, into a buffer it allocated once:
reading with ``recv(READ_SIZE)`` would allocate and release that much on every read,
which costs more than the rest of a small read (a frame is a few hundred bytes)."""

# Ids and tokens index tables on the other side; a token is `epoch << 32 | sequence`.
_MAX_ID = 2**63

MAX_EARLIER = 64
"""The most tokens an ``earlier`` field (of ``reassert`` and of a rejoining ``run``) holds:
the latest earlier tokens of a flight that retried (each attempt has a token of its own)."""

_LENGTH = struct.Struct(">I")

# Built once: json.dumps and json.loads build a new encoder or decoder on every call that
# passes options, which is a measurable part of a small frame's cost.
# ASCII only: a key (a str) may hold a lone surrogate, which has no UTF-8 form; escaped as
# \udXXX it is valid JSON and comes back as the same str.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _refuse_constant(name: str) -> NoReturn:
    # NaN and the infinities are not JSON; a peer that sends them is not speaking the protocol.
    raise ValueError(f"{name} is not JSON")


def _parse_int(literal: str) -> int | float:
    try:
        return int(literal)
    except ValueError:
        return -math.inf if literal.startswith("-") else math.inf


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
# Past int()'s digit limit (4,300 by default) a literal raises ValueError, which would read
# as "not JSON" and close the connection. No field takes such a number: it is a bad field,
# as a too large float is (an infinity fails every check). Only text _DECODER refused is
# read again so: a Python call per integer stays off the path of every frame.
_DECODER_ANY_INT = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_parse_int)


def _decode(text: bytes) -> Any:
    """The JSON ``text`` holds. Raises ValueError (also for bad UTF-8) or RecursionError."""
    decoded = text.decode("utf-8")
    try:
        return _DECODER.decode(decoded)
    except ValueError:
        return _DECODER_ANY_INT.decode(decoded)


class WireError(Exception):
    """The peer broke the protocol; the connection must close. The message says what."""


class FrameTooLarge(WireError):
    """A frame's length is over the reader's ``limit`` (its ``max_frame_bytes``)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a frame of {size} bytes is over the limit of {limit}")
        self.limit = limit


class BadRequest(Exception):
    """A well-formed request the coordinator cannot serve: an unknown ``op`` or a bad field.

    It is answered with an ``error`` frame carrying :attr:`id` (the request's integer id, or
    ``None``) and :attr:`message`; the connection stays open.
    """

    def __init__(self, id: int | None, message: str) -> None:
        super().__init__(message)
        self.id = id
        self.message = message


# ---------------------------------------------------------------------------------------------
# Handshake lines


def refusal_line(version: int = VERSION) -> bytes:
    """The coordinator's answer to a hello of another version or protocol: the version it speaks."""
    return b'{"protocol":"flightgroup","version":%d}\n' % version


def error_line(message: str) -> bytes:
    """The coordinator's answer refusing a connection for another reason than the version."""
    # ASCII-only (json.dumps' default) so that any message, even one with lone surrogates,
    # encodes; json escapes newlines, so the answer stays one line.
    return json.dumps({"ok": False, "error": message}, separators=(",", ":")).encode() + b"\n"


def _loads_line(line: bytes) -> Any:
    """The JSON a handshake line holds, or None if it holds none."""
    try:
        return _decode(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def parse_hello(line: bytes) -> int | None:
    """The version a client's hello names; None if the line is not a flightgroup hello.

    A hello is a JSON object with ``"protocol": "flightgroup"`` and an integer ``"version"``;
    other fields are ignored. A trailing newline is allowed.
    """
    obj = _loads_line(line)
    if not isinstance(obj, dict) or obj.get("protocol") != PROTOCOL:
        return None
    version = obj.get("version")
    if type(version) is not int:  # a bool is an int to isinstance, not to the protocol
        return None
    return version


def parse_answer(line: bytes | None) -> tuple[str, int | str | None]:
    """What the coordinator's answer line to a hello says (client side).

    ``("ok", None)`` for ``{"ok":true}``; ``("version", N)`` for
    ``{"protocol":"flightgroup","version":N}``; ``("refused", message)`` for
    ``{"ok":false,"error":message}``; ``("closed", None)`` for ``None`` (the end of the
    stream), an empty line, or anything else.
    """
    if not line:
        return ("closed", None)
    obj = _loads_line(line)
    if not isinstance(obj, dict):
        return ("closed", None)
    ok = obj.get("ok")
    if ok is True:
        return ("ok", None)
    if ok is False:
        error = obj.get("error")
        return ("refused", error if isinstance(error, str) else "refused without a reason")
    if obj.get("protocol") == PROTOCOL and type(obj.get("version")) is int:
        return ("version", obj["version"])
    return ("closed", None)


async def read_line(reader: asyncio.StreamReader, limit: int = FIRST_LINE_LIMIT) -> bytes | None:
    """One line, up to and including its ``b"\\n"``, of at most ``limit`` bytes before it.

    None if the stream ends before a newline, or the line is longer than ``limit`` (or than the
    stream's own limit). Bytes after the newline stay in the reader, for :func:`read_frame`.
    The caller bounds the wait (the coordinator waits :data:`HANDSHAKE_TIMEOUT`).
    """
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        # Over the stream's limit, which is at least ours in practice; either way too long.
        return None
    if len(line) - 1 > limit:
        return None
    return line


# ---------------------------------------------------------------------------------------------
# Frames


def encode_frame(header: Mapping[str, Any], payload: bytes | None = None) -> bytes:
    """One frame: a 4-byte big-endian body length, then the body.

    The body is ``header`` as compact JSON (ASCII, so any str survives) and, when
    ``payload`` is not None, ``b"\\n"`` and the payload as it is (so ``b""`` is a
    payload, distinct from None). Raises ValueError
    for a header JSON cannot carry (NaN, infinities) or a body of 4 GiB or more.
    """
    head = _ENCODER.encode(header if isinstance(header, dict) else dict(header)).encode()
    return _frame(head, payload)


def _frame(head: bytes, payload: bytes | None = None) -> bytes:
    """The frame of an encoded header and a payload (see :func:`encode_frame`)."""
    size = len(head) if payload is None else len(head) + 1 + len(payload)
    if size >= 2**32:
        raise ValueError(f"a frame body of {size} bytes does not fit its 4-byte length")
    if payload is None:
        return _LENGTH.pack(size) + head
    # One join: the payload, possibly large, is copied once.
    return b"".join((_LENGTH.pack(size), head, b"\n", payload))


def decode_body(body: bytes) -> tuple[dict[str, Any], bytes | None]:
    """Split a frame body into its header (a dict with a string ``op``) and its payload.

    The payload is what follows the first ``b"\\n"``, None when there is none. Raises
    :class:`WireError` when the header is not UTF-8 JSON, not an object, or has no string
    ``op``.
    """
    newline = body.find(b"\n")
    if newline < 0:
        head, payload = body, None
    else:
        head, payload = body[:newline], body[newline + 1 :]
    try:
        header = _decode(head)
    except ValueError as exc:  # bad UTF-8 or bad JSON (UnicodeDecodeError is a ValueError)
        raise WireError(f"the frame header is not JSON: {exc}") from None
    except RecursionError:
        # Deep nesting is bounded only by the frame size; it must not escape as a crash.
        raise WireError("the frame header is nested too deeply") from None
    if not isinstance(header, dict):
        raise WireError(f"the frame header is not a JSON object but {type(header).__name__}")
    if not isinstance(header.get("op"), str):
        raise WireError("the frame header has no string 'op'")
    return header, payload


async def read_frame(
    reader: asyncio.StreamReader, max_frame: int
) -> tuple[dict[str, Any], bytes | None] | None:
    """Read one frame: its header and payload, or None at a clean end of the stream.

    Raises :class:`WireError` for a body length over ``max_frame`` (the body is not read), a
    stream that ends inside a frame, or a body :func:`decode_body` refuses. Errors of the
    transport itself (a reset connection) propagate as they are.
    """
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise WireError("the stream ended inside a frame's length") from None
    (size,) = _LENGTH.unpack(prefix)
    if size > max_frame:
        raise FrameTooLarge(size, max_frame)
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise WireError(
            f"the stream ended inside a frame: {len(exc.partial)} of {size} bytes"
        ) from None
    return decode_body(body)


SKIPPED = "skipped"
"""The ``op`` of the header a skipping :class:`FrameSplitter` puts in place of an answer
over its limit: ``{"op": SKIPPED, "of": <its op>, "id": <its id>, "size": <its payload's
bytes>}``. A coordinator never sends this op; only the splitter makes it."""

# How an answer of this protocol begins (answer frames are made by this module, their
# op and id first): enough to say which request an answer over the limit was for.
_ANSWER_PREFIX = re.compile(rb'\{"op":"([a-z_]{1,16})","id":(null|[0-9]{1,20})[,}]')
_PREFIX_BYTES = 64
_HEAD_BYTES = 4096


class FrameSplitter:
    """Cuts a byte stream into frames as it arrives (as a protocol reads it):
    the push twin of :func:`read_frame`, with the same checks. A length over the limit
    raises :class:`WireError` at once, before its body arrives.

    ``skip_over`` (a client reading its coordinator's answers): a frame over the limit
    whose body begins as an answer does (its op and request id) is not kept but skipped
    as it arrives, and stands in the frames as a :data:`SKIPPED` header, so only the
    request it answers fails. A body that does not begin so still raises."""

    __slots__ = ("_buffer", "_max_frame", "_skip", "_skip_over")

    def __init__(self, max_frame: int, *, skip_over: bool = False) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame
        self._skip_over = skip_over
        self._skip = 0  # bytes of a skipped frame still to come

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes | None]]:
        """The frames that ``data`` completes, in order. Raises WireError at the first bad
        one (the frames before it are lost with the connection, which the caller closes)."""
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                return []
            data = data[self._skip :]
            self._skip = 0
        buffer = self._buffer
        if not buffer and len(data) >= 4:
            # The common case: whole frames in one read, nothing buffered.
            (size,) = _LENGTH.unpack_from(data)
            if len(data) == size + 4 and size <= self._max_frame:
                return [decode_body(data[4:])]
        buffer += data
        frames: list[tuple[dict[str, Any], bytes | None]] = []
        start = 0
        end = len(buffer)
        while end - start >= 4:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if size > self._max_frame:
                if not self._skip_over:
                    raise FrameTooLarge(size, self._max_frame)
                have = end - start - 4
                # Its header's end (the newline before a payload) is looked for in its
                # first _HEAD_BYTES: the error names the payload's size, not the body's.
                scan = min(size, _HEAD_BYTES)
                newline = buffer.find(b"\n", start + 4, start + 4 + min(have, scan))
                if newline < 0 and have < scan:
                    break  # its header is still to come
                begun = bytes(buffer[start + 4 : start + 4 + min(have, _PREFIX_BYTES)])
                payload = size if newline < 0 else size - (newline - start - 4) - 1
                frames.append(self._skipped(begun, size, payload))
                take = min(size, have)
                start += 4 + take
                self._skip = size - take
                continue
            if end - start - 4 < size:
                break
            frames.append(decode_body(bytes(buffer[start + 4 : start + 4 + size])))
            start += 4 + size
        if start:
            del buffer[:start]
        return frames

    def _skipped(self, begun: bytes, size: int, payload: int) -> tuple[dict[str, Any], None]:
        match = _ANSWER_PREFIX.match(begun)
        if match is None:
            raise FrameTooLarge(size, self._max_frame)
        op, id = match.group(1).decode(), match.group(2)
        return {
            "op": SKIPPED, "of": op, "id": None if id == b"null" else int(id), "size": payload,
        }, None

    @property
    def pending(self) -> int:
        """Bytes received that do not make a whole frame yet (a stream that ends here
        ended inside a frame)."""
        return len(self._buffer) + self._skip


# ---------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True, slots=True)
class Run:
    """``run``: lead or join the flight of ``key``; a ``flight`` token makes it a rejoin,
    ``earlier``: the flight's tokens the caller heard before ``flight`` (its retries)."""

    id: int
    key: str
    fresh: bool = False
    flight: int | None = None
    earlier: tuple[int, ...] = ()
    after: int | None = None  # (fresh) any flight that began after this token's will do
    notices: bool = False  # its connection hears `detached` (ADR 0026)


@dataclass(frozen=True, slots=True)
class Land:
    """``land``: the outcome of the lead ``id``'s attempt with ``token``."""

    id: int
    token: int
    outcome: SharedOutcome


@dataclass(frozen=True, slots=True)
class Attempt:
    """``attempt``: a new token for the retry of the lead ``id``."""

    id: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """``cancel``: withdraw the request ``id``."""

    id: int


@dataclass(frozen=True, slots=True)
class Reassert:
    """``reassert``: a new coordinator is told this process leads ``key`` with ``token``;
    ``earlier``: the flight's tokens before ``token`` (one per earlier attempt);
    ``landed``: the flight landed already (its ``land`` follows on the connection)."""

    id: int
    key: str
    token: int
    earlier: tuple[int, ...] = ()
    landed: bool = False
    notices: bool = False  # its connection hears `detached` (ADR 0026)


@dataclass(frozen=True, slots=True)
class Forget:
    """``forget``: drop the kept outcome of ``key`` and let the next call lead; with an
    ``id``, answered ``ack`` once done (the caller waits for it: read your writes)."""

    key: str
    id: int | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """``status``: the flights in progress."""

    id: int


Request: TypeAlias = Run | Land | Attempt | Cancel | Reassert | Forget | Status


@dataclass(frozen=True, slots=True)
class Lead:
    """``lead``: the request ``id`` leads, with ``token``."""

    id: int
    token: int


@dataclass(frozen=True, slots=True)
class Joined:
    """``joined``: the request ``id`` joined the flight ``token`` of process ``pid``,
    which started ``age`` seconds ago."""

    id: int
    token: int
    pid: int
    age: float


@dataclass(frozen=True, slots=True)
class Landed:
    """``landed``: the outcome of the flight ``token`` (``kept``: served from a kept outcome)."""

    id: int
    token: int
    outcome: SharedOutcome
    kept: bool = False


@dataclass(frozen=True, slots=True)
class InterruptedAnswer:
    """``interrupted``: the flight the request ``id`` waited for ended without an outcome."""

    id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Ack:
    """``ack``: the landing of the lead ``id`` reached every joiner; the lead is over."""

    id: int


@dataclass(frozen=True, slots=True)
class Detached:
    """``detached``: the flight the request ``id`` leads or joined is no longer its
    key's (a forget()): no later call joins it, so neither may a local call."""

    id: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """``rejected``: the lead ``id`` is no longer this process's (its lease is lost)."""

    id: int
    reason: str


@dataclass(frozen=True, slots=True)
class StatusAnswer:
    """``status``: the flights in progress, as the coordinator describes them."""

    id: int
    flights: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """``error``: the request ``id`` (None if it had no integer id) was not understood.
    ``limit``: set when a frame was over the coordinator's ``max_frame_bytes`` (then
    the connection closes; a sender must not send that frame again)."""

    id: int | None
    message: str
    limit: int | None = None


Answer: TypeAlias = (
    Lead
    | Joined
    | Landed
    | InterruptedAnswer
    | Ack
    | Detached
    | Rejected
    | StatusAnswer
    | ErrorAnswer
)


# ---------------------------------------------------------------------------------------------
# Field checks. Each raises BadRequest(None, message); the callers fill in the id (requests)
# or turn it into a WireError (answers), so one set of rules serves both directions.


def _show(value: Any) -> str:
    """A short repr for a message: a peer's field may be megabytes long."""
    try:
        text = repr(value)
    except RecursionError:  # nested as deep as the decoder allows
        return "<a value nested too deeply to show>"
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(name: str, want: str, header: Mapping[str, Any]) -> NoReturn:
    if name in header:
        raise BadRequest(None, f"field {name!r} must be {want}, got {_show(header[name])}")
    raise BadRequest(None, f"field {name!r} is missing; it must be {want}")


def _id_field(header: Mapping[str, Any], name: str) -> int:
    value = header.get(name)
    if type(value) is not int or not 0 <= value < _MAX_ID:
        _bad(name, "an integer in [0, 2**63)", header)
    return value


def _str_field(header: Mapping[str, Any], name: str) -> str:
    value = header.get(name)
    if not isinstance(value, str):
        _bad(name, "a string", header)
    return value


def _key_field(header: Mapping[str, Any]) -> str:
    value = header.get("key")
    if not isinstance(value, str) or not value:
        _bad("key", "a non-empty string", header)
    return value


def _earlier_field(header: Mapping[str, Any]) -> tuple[int, ...]:
    """The optional ``earlier`` tokens: absent or null is none; else a list of at most
    :data:`MAX_EARLIER` ids (each checked as a token is)."""
    value = header.get("earlier")
    if value is None:
        return ()
    if (
        type(value) is not list
        or len(value) > MAX_EARLIER
        or not all(type(t) is int and 0 <= t < _MAX_ID for t in value)
    ):
        _bad("earlier", f"a list of at most {MAX_EARLIER} integers in [0, 2**63)", header)
    return tuple(value)


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None if it is not a finite JSON number."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:  # an integer beyond any float
            return None
    return None


def _positive_field(header: Mapping[str, Any], name: str) -> float:
    value = _number(header.get(name))
    if value is None or value <= 0:
        _bad(name, "a finite number > 0", header)
    return value


def _keep_field(header: Mapping[str, Any]) -> float | None:
    if header.get("keep") is None:  # absent or null: not kept
        return None
    return _positive_field(header, "keep")


def _bound_field(header: Mapping[str, Any], name: str) -> int | None:
    """An optional Retention bound (``max_items``, ``max_bytes``): absent or null is
    none (the coordinator's own); else an integer in [1, 2**63)."""
    value = header.get(name)
    if value is None:
        return None
    if type(value) is not int or not 1 <= value < _MAX_ID:
        _bad(name, "an integer in [1, 2**63)", header)
    return value


def _request_id(header: Mapping[str, Any]) -> int | None:
    """The id an ``error`` answer echoes: the request's, when it was an integer."""
    value = header.get("id")
    return value if type(value) is int else None


# ---------------------------------------------------------------------------------------------
# Outcomes


def outcome_fields(outcome: SharedOutcome) -> tuple[dict[str, Any], bytes | None]:
    """The header fields and payload that carry ``outcome`` (in ``land`` and ``landed``)."""
    fields: dict[str, Any]
    if isinstance(outcome, Value):
        fields = {"outcome": "value"}
        _retention_fields(fields, outcome)
        return fields, outcome.data
    if isinstance(outcome, Failure):
        fields = {
            "outcome": "error",
            "error": {"type": outcome.type, "module": outcome.module, "message": outcome.message},
        }
        _retention_fields(fields, outcome)
        return fields, None
    if isinstance(outcome, Timeout):
        return {"outcome": "timeout", "deadline": outcome.deadline}, None
    if isinstance(outcome, Interrupted):
        return {"outcome": "interrupted", "reason": outcome.reason}, None
    raise TypeError(f"not an outcome: {outcome!r}")


def _retention_fields(fields: dict[str, Any], outcome: Value | Failure) -> None:
    """``keep``, ``max_items`` and ``max_bytes`` of a value or failure, where set."""
    if outcome.keep is not None:
        fields["keep"] = outcome.keep
    if outcome.max_items is not None:
        fields["max_items"] = outcome.max_items
    if outcome.max_bytes is not None:
        fields["max_bytes"] = outcome.max_bytes


def _outcome(header: Mapping[str, Any], payload: bytes | None) -> SharedOutcome:
    kind = header.get("outcome")
    if kind == "value":
        if payload is None:
            raise BadRequest(None, "outcome 'value' needs a payload (the encoded value)")
        return Value(
            payload, _keep_field(header), _bound_field(header, "max_items"),
            _bound_field(header, "max_bytes"),
        )
    if kind == "error":
        error = header.get("error")
        if not isinstance(error, dict):
            _bad("error", "an object with string 'type', 'module' and 'message'", header)
        try:
            type_ = _str_field(error, "type")
            module = _str_field(error, "module")
            message = _str_field(error, "message")
        except BadRequest as exc:
            raise BadRequest(None, f"in field 'error': {exc.message}") from None
        return Failure(
            type_, module, message, _keep_field(header), _bound_field(header, "max_items"),
            _bound_field(header, "max_bytes"),
        )
    if kind == "timeout":
        return Timeout(_positive_field(header, "deadline"))
    if kind == "interrupted":
        return Interrupted(_str_field(header, "reason"))
    _bad("outcome", "one of 'value', 'error', 'timeout', 'interrupted'", header)


def parse_outcome(header: dict[str, Any], payload: bytes | None) -> SharedOutcome:
    """The outcome that ``header``'s outcome fields and ``payload`` carry.

    Raises :class:`BadRequest` (with the header's integer id, if any) naming the bad field.
    """
    try:
        return _outcome(header, payload)
    except BadRequest as exc:
        raise BadRequest(_request_id(header), exc.message) from None


# ---------------------------------------------------------------------------------------------
# Requests (coordinator side)


def _flag(header: Mapping[str, Any], name: str) -> bool:
    """An optional boolean field: absent or null is false; anything else is a bad field."""
    value = header.get(name)
    if value is None:
        return False
    if type(value) is not bool:
        _bad(name, "a boolean", header)
    return value


def _run(header: Mapping[str, Any], payload: bytes | None) -> Run:
    id = _id_field(header, "id")
    key = _key_field(header)
    fresh = _flag(header, "fresh")
    flight = None if header.get("flight") is None else _id_field(header, "flight")
    after = None
    if header.get("after") is not None:
        after = _id_field(header, "after")
        if not fresh:
            _bad("after", "absent unless fresh is true", header)
    return Run(id, key, fresh, flight, _earlier_field(header), after, _flag(header, "notices"))


def _land(header: Mapping[str, Any], payload: bytes | None) -> Land:
    return Land(_id_field(header, "id"), _id_field(header, "token"), _outcome(header, payload))


def _attempt(header: Mapping[str, Any], payload: bytes | None) -> Attempt:
    return Attempt(_id_field(header, "id"))


def _cancel(header: Mapping[str, Any], payload: bytes | None) -> Cancel:
    return Cancel(_id_field(header, "id"))


def _reassert(header: Mapping[str, Any], payload: bytes | None) -> Reassert:
    return Reassert(
        _id_field(header, "id"),
        _key_field(header),
        _id_field(header, "token"),
        _earlier_field(header),
        _flag(header, "landed"),
        _flag(header, "notices"),
    )


def _forget(header: Mapping[str, Any], payload: bytes | None) -> Forget:
    id = None if header.get("id") is None else _id_field(header, "id")
    return Forget(_key_field(header), id)


def _status(header: Mapping[str, Any], payload: bytes | None) -> Status:
    return Status(_id_field(header, "id"))


_REQUESTS: dict[str, Callable[[Mapping[str, Any], bytes | None], Request]] = {
    "run": _run,
    "land": _land,
    "attempt": _attempt,
    "cancel": _cancel,
    "reassert": _reassert,
    "forget": _forget,
    "status": _status,
}


def parse_request(header: dict[str, Any], payload: bytes | None) -> Request:
    """The request a decoded frame carries (coordinator side).

    Raises :class:`BadRequest` for an unknown ``op`` or a missing or bad field, with the
    request's integer id (else None) and a message naming the field. Unknown fields and a
    payload the request does not use are ignored, for forward compatibility.
    """
    op = header.get("op")
    parse = _REQUESTS.get(op) if isinstance(op, str) else None
    try:
        if parse is None:
            raise BadRequest(None, f"unknown op {_show(op)}")
        return parse(header, payload)
    except BadRequest as exc:
        raise BadRequest(_request_id(header), exc.message) from None


# ---------------------------------------------------------------------------------------------
# Answers (client side)


def _lead(header: Mapping[str, Any], payload: bytes | None) -> Lead:
    return Lead(_id_field(header, "id"), _id_field(header, "token"))


def _joined(header: Mapping[str, Any], payload: bytes | None) -> Joined:
    id = _id_field(header, "id")
    token = _id_field(header, "token")
    pid = header.get("pid")
    if type(pid) is not int or pid < 0:
        _bad("pid", "a non-negative integer", header)
    age = _number(header.get("age"))
    if age is None or age < 0:
        _bad("age", "a finite number >= 0", header)
    return Joined(id, token, pid, age)


def _landed(header: Mapping[str, Any], payload: bytes | None) -> Landed:
    id = _id_field(header, "id")
    token = _id_field(header, "token")
    outcome = _outcome(header, payload)
    kept = header.get("kept", False)
    if type(kept) is not bool:
        _bad("kept", "a boolean", header)
    return Landed(id, token, outcome, kept)


def _interrupted(header: Mapping[str, Any], payload: bytes | None) -> InterruptedAnswer:
    return InterruptedAnswer(_id_field(header, "id"), _str_field(header, "reason"))


def _ack(header: Mapping[str, Any], payload: bytes | None) -> Ack:
    return Ack(_id_field(header, "id"))


def _detached(header: Mapping[str, Any], payload: bytes | None) -> Detached:
    return Detached(_id_field(header, "id"))


def _rejected(header: Mapping[str, Any], payload: bytes | None) -> Rejected:
    return Rejected(_id_field(header, "id"), _str_field(header, "reason"))


def _status_answer(header: Mapping[str, Any], payload: bytes | None) -> StatusAnswer:
    id = _id_field(header, "id")
    flights = header.get("flights")
    if not isinstance(flights, list) or not all(isinstance(f, dict) for f in flights):
        _bad("flights", "a list of objects", header)
    return StatusAnswer(id, flights)


def _error_answer(header: Mapping[str, Any], payload: bytes | None) -> ErrorAnswer:
    id = header.get("id")
    if id is not None and type(id) is not int:
        _bad("id", "an integer or null", header)
    limit = header.get("limit")
    if limit is not None and (type(limit) is not int or limit < 0):
        _bad("limit", "a non-negative integer or null", header)
    return ErrorAnswer(id, _str_field(header, "message"), limit)


_ANSWERS: dict[str, Callable[[Mapping[str, Any], bytes | None], Answer]] = {
    "lead": _lead,
    "joined": _joined,
    "landed": _landed,
    "interrupted": _interrupted,
    "ack": _ack,
    "detached": _detached,
    "rejected": _rejected,
    "status": _status_answer,
    "error": _error_answer,
}


def parse_answer_frame(header: dict[str, Any], payload: bytes | None) -> Answer:
    """The answer a decoded frame carries (client side).

    Raises :class:`WireError` for an unknown ``op`` or a missing or bad field: a coordinator
    that answers nonsense is closed and reconnected to.
    """
    op = header.get("op")
    parse = _ANSWERS.get(op) if isinstance(op, str) else None
    if parse is None:
        raise WireError(f"unknown answer op {_show(op)}")
    try:
        return parse(header, payload)
    except BadRequest as exc:
        raise WireError(f"bad {op!r} answer: {exc.message}") from None


# ---------------------------------------------------------------------------------------------
# Builders. Each returns one frame; fields at their default are left out. The frames of every
# call's round trip (run, lead, joined, a value's land and landed, ack, ...) are filled into byte
# templates: several times cheaper than encoding a dict, and byte for byte what encode_frame
# makes (the tests pin that). `%d` of an int is always a JSON integer, a float goes through
# _float, a key through the JSON encoder's string path.


def _float(value: float) -> bytes:
    """A finite number as the JSON encoder writes a float (``float.__repr__``), else ValueError."""
    value = float(value)  # an int becomes the float the peer reads anyway
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not JSON")
    return repr(value).encode()


def _keep(keep: float | None) -> bytes:
    return b"" if keep is None else b',"keep":' + _float(keep)


def _retention(value: Value) -> bytes:
    """The ``keep``, ``max_items`` and ``max_bytes`` fields of a template."""
    text = _keep(value.keep)
    if value.max_items is not None:
        text += b',"max_items":%d' % value.max_items
    if value.max_bytes is not None:
        text += b',"max_bytes":%d' % value.max_bytes
    return text


def _earlier_list(earlier: Sequence[int]) -> list[int]:
    """The tokens of an ``earlier`` field; ValueError for more than :data:`MAX_EARLIER`."""
    if len(earlier) > MAX_EARLIER:
        raise ValueError(f"{len(earlier)} earlier tokens; at most {MAX_EARLIER} go in a frame")
    return [int(t) for t in earlier]


def _earlier(earlier: Sequence[int]) -> bytes:
    """The ``earlier`` field of a template (``,"earlier":[...]``)."""
    return b',"earlier":[%s]' % b",".join(b"%d" % t for t in _earlier_list(earlier))


def run_frame(
    id: int,
    key: str,
    *,
    fresh: bool = False,
    flight: int | None = None,
    earlier: Sequence[int] = (),
    after: int | None = None,
    notices: bool = False,
) -> bytes:
    """``run``: lead or join ``key``; ``fresh`` joins only a later flight (``after``: one
    that began after the flight of that token); ``flight`` rejoins (``earlier``: the
    flight's tokens heard before it, oldest first); ``notices``: this connection hears
    ``detached``."""
    body = b'{"op":"run","id":%d,"key":%s' % (id, _ENCODER.encode(key).encode())
    if fresh:
        body += b',"fresh":true'
        if after is not None:
            body += b',"after":%d' % after
    if flight is not None:
        body += b',"flight":%d' % flight
    if earlier:  # a rejoin of a flight that retried
        body += _earlier(earlier)
    if notices:
        body += b',"notices":true'
    return _frame(body + b"}")


def land_frame(id: int, token: int, outcome: SharedOutcome) -> bytes:
    """``land``: the outcome of the lead ``id``'s attempt ``token``."""
    if type(outcome) is Value:  # the common landing: no dict, no encoder
        head = b'{"op":"land","id":%d,"token":%d,"outcome":"value"%s}' % (
            id,
            token,
            _retention(outcome),
        )
        return _frame(head, outcome.data)
    fields, payload = outcome_fields(outcome)
    return encode_frame({"op": "land", "id": id, "token": token, **fields}, payload)


def attempt_frame(id: int) -> bytes:
    """``attempt``: ask for a new token for the retry of the lead ``id``."""
    return _frame(b'{"op":"attempt","id":%d}' % id)


def cancel_frame(id: int) -> bytes:
    """``cancel``: withdraw the request ``id``."""
    return _frame(b'{"op":"cancel","id":%d}' % id)


def reassert_frame(
    id: int,
    key: str,
    token: int,
    earlier: Sequence[int] = (),
    *,
    landed: bool = False,
    notices: bool = False,
) -> bytes:
    """``reassert``: tell a new coordinator this process leads ``key`` with ``token``
    (``earlier``: the flight's tokens of its earlier attempts, oldest first; ``landed``:
    its ``land`` follows; ``notices``: this connection hears ``detached``)."""
    header: dict[str, Any] = {"op": "reassert", "id": id, "key": key, "token": token}
    if earlier:
        header["earlier"] = _earlier_list(earlier)
    if landed:
        header["landed"] = True
    if notices:
        header["notices"] = True
    return encode_frame(header)


def forget_frame(key: str, id: int | None = None) -> bytes:
    """``forget``: drop what the coordinator keeps of ``key`` (``id``: answer ``ack``)."""
    if id is None:
        return encode_frame({"op": "forget", "key": key})
    return encode_frame({"op": "forget", "key": key, "id": id})


def status_frame(id: int) -> bytes:
    """``status``: ask for the flights in progress."""
    return _frame(b'{"op":"status","id":%d}' % id)


def lead_frame(id: int, token: int) -> bytes:
    """``lead``: the request ``id`` leads with ``token``."""
    return _frame(b'{"op":"lead","id":%d,"token":%d}' % (id, token))


def joined_frame(id: int, token: int, pid: int, age: float) -> bytes:
    """``joined``: the request ``id`` joined the flight ``token`` of ``pid``, ``age`` s old."""
    head = b'{"op":"joined","id":%d,"token":%d,"pid":%d,"age":%s}' % (id, token, pid, _float(age))
    return _frame(head)


def landed_frame(id: int, token: int, outcome: SharedOutcome, kept: bool = False) -> bytes:
    """``landed``: the outcome of the flight ``token`` for the request ``id``."""
    if type(outcome) is Value:  # sent to every joiner: no dict, no encoder
        head = b'{"op":"landed","id":%d,"token":%d,"outcome":"value"%s,"kept":%s}' % (
            id,
            token,
            _retention(outcome),
            b"true" if kept else b"false",
        )
        return _frame(head, outcome.data)
    fields, payload = outcome_fields(outcome)
    header = {"op": "landed", "id": id, "token": token, **fields, "kept": kept}
    return encode_frame(header, payload)


def interrupted_frame(id: int, reason: str) -> bytes:
    """``interrupted``: the flight the request ``id`` waited for ended without an outcome."""
    return encode_frame({"op": "interrupted", "id": id, "reason": reason})


def ack_frame(id: int) -> bytes:
    """``ack``: the landing of the lead ``id`` reached every joiner."""
    return _frame(b'{"op":"ack","id":%d}' % id)


def detached_frame(id: int) -> bytes:
    """``detached``: the flight of the request ``id`` is no longer its key's."""
    return _frame(b'{"op":"detached","id":%d}' % id)


def rejected_frame(id: int, reason: str) -> bytes:
    """``rejected``: the lead ``id`` is no longer this process's."""
    return encode_frame({"op": "rejected", "id": id, "reason": reason})


def status_answer_frame(id: int, flights: list[dict[str, Any]]) -> bytes:
    """``status``: the flights in progress."""
    return encode_frame({"op": "status", "id": id, "flights": flights})


def error_frame(id: int | None, message: str, limit: int | None = None) -> bytes:
    """``error``: the request ``id`` was not understood, and why (``limit``: the frame
    was over this ``max_frame_bytes``)."""
    fields: dict[str, Any] = {"op": "error", "id": id, "message": message}
    if limit is not None:
        fields["limit"] = limit
    return encode_frame(fields)
