"""Codecs: how an outcome's value crosses a process boundary.

A codec is any object with ``encode(value) -> bytes | str`` and
``decode(data: bytes) -> value``. A ``str`` from ``encode`` travels as UTF-8.
Every caller of a flight, its leader too, gets ``decode(encode(value))``, so all
callers see the value in the same shape.

A codec may also have ``for_type(tp, /, *, name) -> Codec``: a decorated function's
calls then use the codec it returns for the function's declared return type ``tp``
(``name`` is the operation's namespace, for its errors). This module resolves that
once per decorated function (:func:`operation_codec`); ``flightgroup.typed`` has the
codec that uses it.
"""

from __future__ import annotations

import inspect
import json
import pickle
import threading
import typing
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["JSON", "PICKLE", "Codec", "check_codec", "encode_bytes", "operation_codec"]


@runtime_checkable
class Codec(Protocol):
    """Turns a value into bytes (or text) for other processes, and back.

    A codec may also have ``for_type(tp, /, *, name) -> Codec``, which a decorated
    function's calls use for its declared return type (docs/codecs.md)."""

    def encode(self, value: Any, /) -> bytes | str:
        """Return the value's wire form; raise if it cannot be encoded."""
        ...

    def decode(self, data: bytes, /) -> Any:
        """Return the value that ``data`` (as made by ``encode``) stands for."""
        ...


# Built once: json.dumps with options builds a new encoder on every call.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_JSON_DECODER = json.JSONDecoder()  # json.loads's own, without its checks of its input


class _JSONCodec:
    """The standard JSON rules (a tuple comes back as a list). Compact, UTF-8."""

    __slots__ = ()

    def encode(self, value: Any, /) -> bytes:
        return _JSON_ENCODER.encode(value).encode()

    def decode(self, data: bytes, /) -> Any:
        # What encode made is UTF-8 without a BOM: no need to sniff the encoding
        # (json.loads of bytes does); its errors are json.loads's own.
        return _JSON_DECODER.decode(str(data, "utf-8", "surrogatepass"))

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


def operation_codec(codec: Codec | None, fn: Callable[..., Any], name: str) -> Codec | None:
    """The codec the calls of ``fn``, decorated as the operation ``name``, use: ``codec``
    itself, or, if it has ``for_type``, the codec it makes for ``fn``'s declared return
    type (the awaited type of an ``async def``). A return type that names what is not
    defined yet (a forward reference) is looked up at the first encode or decode."""
    for_type = getattr(codec, "for_type", None)
    if codec is None or for_type is None:
        return codec
    try:
        declared = _declared_return(fn)
    except NameError:
        return _LateTyped(codec, fn, name)
    if declared is _UNDECLARED:
        return codec
    return check_codec(for_type(declared, name=name))


_UNDECLARED: Any = object()


class _Returns:
    """Holds one function's return annotation alone, for ``typing.get_type_hints``."""

    def __init__(self, annotation: object) -> None:
        self.__annotations__ = {"return": annotation}


def _declared_return(fn: Callable[..., Any]) -> Any:
    """``fn``'s declared return type, or _UNDECLARED. Raises NameError for a name
    the annotation uses that is not defined (yet). Only the return annotation is read:
    a parameter's may name what exists only for type checkers (``TYPE_CHECKING``)."""
    target = inspect.unwrap(fn)
    if inspect.ismethod(target):
        target = target.__func__
    if not inspect.isfunction(target):
        return _UNDECLARED
    annotation = target.__annotations__.get("return", _UNDECLARED)
    if annotation is _UNDECLARED:
        return _UNDECLARED
    hints = typing.get_type_hints(
        _Returns(annotation), globalns=target.__globals__, include_extras=True
    )
    return hints["return"]


class _LateTyped:
    """A typed codec for a function whose return type could not be resolved when it was
    decorated: resolved at the first encode or decode (then every call uses it)."""

    __slots__ = ("_codec", "_fn", "_lock", "_name", "_typed")

    def __init__(self, codec: Codec, fn: Callable[..., Any], name: str) -> None:
        self._codec, self._fn, self._name = codec, fn, name
        self._typed: Codec | None = None
        self._lock = threading.Lock()

    def _resolved(self) -> Codec:
        typed = self._typed
        if typed is None:
            with self._lock:  # one resolution: every caller then shares its codec
                typed = self._typed
                if typed is None:
                    try:
                        declared = _declared_return(self._fn)
                    except NameError as exc:
                        raise TypeError(
                            f"the return type of {self._name} names what is not defined: {exc}"
                        ) from exc
                    typed = self._codec
                    if declared is not _UNDECLARED:
                        typed = check_codec(
                            self._codec.for_type(declared, name=self._name)  # type: ignore[attr-defined]
                        )
                    self._typed = typed
        return typed

    def encode(self, value: Any, /) -> bytes | str:
        return self._resolved().encode(value)

    def decode(self, data: bytes, /) -> Any:
        return self._resolved().decode(data)

    def __repr__(self) -> str:
        return f"{self._codec!r} for {self._name}"
