"""Codecs: how an outcome's value crosses a process boundary.

A codec is any object with ``encode(value) -> bytes | str`` and
``decode(data: bytes) -> value``. A ``str`` from ``encode`` travels as UTF-8.
Every caller of a flight, its leader too, gets ``decode(encode(value))``, so all
callers see the value in the same shape.
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Protocol, runtime_checkable

__all__ = ["JSON", "PICKLE", "Codec", "check_codec", "encode_bytes"]


@runtime_checkable
class Codec(Protocol):
    """Turns a value into bytes (or text) for other processes, and back."""

    def encode(self, value: Any, /) -> bytes | str:
        """Return the value's wire form; raise if it cannot be encoded."""
        ...

    def decode(self, data: bytes, /) -> Any:
        """Return the value that ``data`` (as made by ``encode``) stands for."""
        ...


# Built once: json.dumps with options builds a new encoder on every call.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class _JSONCodec:
    """The standard JSON rules (a tuple comes back as a list). Compact, UTF-8."""

    __slots__ = ()

    def encode(self, value: Any, /) -> bytes:
        return _JSON_ENCODER.encode(value).encode()

    def decode(self, data: bytes, /) -> Any:
        return json.loads(data)

    def __repr__(self) -> str:
        return "flightgroup.JSON"


class _PickleCodec:
    """Python objects as they are. Only for groups whose processes trust each other:
    decoding a pickle can run any code."""

    __slots__ = ()

    def encode(self, value: Any, /) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes, /) -> Any:
        return pickle.loads(data)  # trusted groups only (documented)

    def __repr__(self) -> str:
        return "flightgroup.PICKLE"


JSON: Codec = _JSONCodec()
"""Standard JSON (NaN and infinities are refused, so every peer can read the text)."""

PICKLE: Codec = _PickleCodec()
"""Pickle, for groups whose processes trust each other."""


def check_codec(codec: object) -> Codec:
    """Return ``codec`` if it has callable ``encode`` and ``decode``; else TypeError."""
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        raise TypeError(
            f"codec must have callable encode(value) and decode(data) methods, got {codec!r}"
        )
    return codec  # type: ignore[return-value]


def encode_bytes(codec: Codec, value: Any) -> bytes:
    """Encode ``value`` and return bytes (a ``str`` becomes UTF-8)."""
    data = codec.encode(value)
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{codec!r}.encode returned {type(data).__name__}, not bytes or str")
