"""The typed codec: a value crosses as JSON (or MessagePack) and comes back as the type
the operation declares, built on msgspec (extra ``flightgroup[typed]``; ADR 0043).

``TypedCodec()`` given to a group or to one operation (``coalesce(codec=...)``) is made,
for each decorated function, for the function's declared return type (``for_type``,
see :mod:`flightgroup.codec`): a dataclass comes back as that dataclass, a tuple as a
tuple, a set as a set, a ``dict[int, ...]``'s keys as ints, and so on for what msgspec
supports (TypedDict, NamedTuple, Enum, datetime, date, UUID, Decimal, bytes, Optional
and unions, nested). Every caller of a flight, its leader too, gets that value.

The leader's encode checks the value against the type (it decodes what it encoded, as
every caller will), so a value that does not match fails the flight in its leader, with
a TypeError that names the operation and the type; its joiners get FlightFailedError.
For a plain ``run``/``run_sync`` call (no declared type) it is an untyped codec: JSON as
msgspec writes it, decoded into lists, dicts and scalars.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

try:
    import msgspec
except ImportError as exc:  # the core installs without it
    raise ImportError(
        "flightgroup.typed needs msgspec: pip install 'flightgroup[typed]'"
    ) from exc

__all__ = ["TypedCodec"]

Format = Literal["json", "msgpack"]


class TypedCodec:
    """A codec that encodes and decodes by a type (``Any``: untyped), on msgspec.

    ``tp`` is the type every decoded value has; without it, a decorated function's
    declared return type is used (``for_type``), and plain calls are untyped. ``format``
    is the wire form: ``"json"`` (text, readable in Redis and by other languages) or
    ``"msgpack"`` (binary, smaller). Every process of a group must use the same format.

    Encode raises TypeError, naming the operation and the type, for a value msgspec
    cannot encode or (typed) one that does not match the type; decode raises msgspec's
    DecodeError / ValidationError (both ValueError) for data that does not match.
    """

    __slots__ = ("_checks", "_decoder", "_encoder", "format", "name", "type")

    def __init__(self, tp: Any = Any, *, format: Format = "json", name: str | None = None) -> None:
        if format == "json":
            module: Any = msgspec.json
        elif format == "msgpack":
            module = msgspec.msgpack
        else:
            raise ValueError(f"format must be 'json' or 'msgpack', not {format!r}")
        self.type: Any = tp
        self.format: Format = format
        self.name = name
        self._encoder = module.Encoder()
        try:
            self._decoder = module.Decoder(tp)
        except TypeError as exc:  # a type msgspec cannot decode into
            raise TypeError(f"{self._what()}: msgspec cannot decode {_named(tp)}: {exc}") from exc
        # Untyped, whatever encodes decodes: nothing to check.
        self._checks = tp is not Any

    def for_type(self, tp: Any, /, *, name: str) -> TypedCodec:
        """This codec for the operation ``name`` whose declared return type is ``tp``.
        A codec made with a type keeps its own (the type given wins over the declared)."""
        if self._checks:
            return self if self.name == name else TypedCodec(self.type, format=self.format,
                                                             name=name)
        return TypedCodec(tp, format=self.format, name=name)

    def encode(self, value: Any, /) -> bytes:
        """The value's wire form; TypeError if it cannot be encoded or does not match."""
        try:
            data: bytes = self._encoder.encode(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(
                f"{self._what()} returned a value of type {type(value).__qualname__} that"
                f" cannot be encoded{self._as()}: {exc}"
            ) from exc
        if self._checks:
            try:
                self._decoder.decode(data)
            except msgspec.ValidationError as exc:
                raise TypeError(
                    f"{self._what()} returned a value that is not {_named(self.type)}: {exc}"
                ) from exc
        return data

    def decode(self, data: bytes, /) -> Any:
        """The value ``data`` stands for, of this codec's type."""
        return self._decoder.decode(data)

    def _what(self) -> str:
        return "the work" if self.name is None else self.name

    def _as(self) -> str:
        return f" as {_named(self.type)}" if self._checks else ""

    def __repr__(self) -> str:
        typed = "" if not self._checks else _named(self.type)
        options = [typed] if typed else []
        if self.format != "json":
            options.append(f"format={self.format!r}")
        if self.name is not None:
            options.append(f"name={self.name!r}")
        return f"TypedCodec({', '.join(options)})"


def _named(tp: Any) -> str:
    """A type as its declaration reads (``Report``, ``tuple[int, str]``, ``int | None``)."""
    if tp is None or tp is type(None):
        return "None"
    if tp is Ellipsis:
        return "..."
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is None or not args:
        return tp.__qualname__ if isinstance(tp, type) else repr(tp).replace("typing.", "")
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_named(arg) for arg in args)
    if origin is Literal or origin is typing.Annotated:
        return repr(tp).replace("typing.", "")
    return f"{_named(origin)}[{', '.join(_named(arg) for arg in args)}]"
