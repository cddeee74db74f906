"""The directory protocol's framing: the handshake lines, the length-prefixed frames, and
reading them (:func:`read_line`, :func:`read_frame`, the push reader :class:`FrameSplitter`).

It owns the byte stream's rules: the limits (:data:`FIRST_LINE_LIMIT`, a frame's
``max_frame``), what a frame body is (a JSON header with a string ``op``, then an optional
payload after the first newline), and :class:`WireError`, the one error that says the
stream can no longer be trusted. What a header means is :mod:`.messages`' business.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import struct
from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = [
    "DEFAULT_MAX_FRAME",
    "ENCODER",
    "FIRST_LINE_LIMIT",
    "HANDSHAKE_TIMEOUT",
    "HELLO",
    "PROTOCOL",
    "READ_SIZE",
    "SKIPPED",
    "VERSION",
    "WELCOME",
    "FrameSplitter",
    "FrameTooLarge",
    "WireError",
    "decode_body",
    "encode_frame",
    "error_line",
    "join_frame",
    "parse_answer",
    "parse_hello",
    "read_frame",
    "read_line",
    "refusal_line",
]

PROTOCOL = "flightgroup"
"""The protocol name a hello and a version refusal carry."""

VERSION = 1
"""The protocol version this module speaks."""

HELLO: bytes = b'{"protocol":"flightgroup","version":1}\n'
"""The client's first line, byte for byte as docs/api.md fixes it."""

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

_LENGTH = struct.Struct(">I")

# Built once: json.dumps and json.loads build a new encoder or decoder on every call that
# passes options, which is a measurable part of a small frame's cost.
# ASCII only: a key (a str) may hold a lone surrogate, which has no UTF-8 form; escaped as
# \udXXX it is valid JSON and comes back as the same str.
ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


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
    head = ENCODER.encode(header if isinstance(header, dict) else dict(header)).encode()
    return join_frame(head, payload)


def join_frame(head: bytes, payload: bytes | None = None) -> bytes:
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

# How an answer of this protocol begins (the answer builders, builders.py, write their
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
