"""The directory protocol's messages: a dataclass per request and per answer, the
checks of their fields, and the parsers from a decoded frame (:func:`parse_request` on the
coordinator's side, :func:`parse_answer_frame` on the client's).

It owns what a header means: which ``op`` s exist, which fields each takes and their
ranges. One set of field checks serves both directions: a bad request is a
:class:`BadRequest` (the coordinator answers ``error``, the stream is still in step), a bad
answer a :class:`~.framing.WireError` (the client closes and reconnects).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias

from ...scope.outcome import Failure, Interrupted, SharedOutcome, Timeout, Value
from .framing import WireError

__all__ = [
    "MAX_EARLIER",
    "Ack",
    "Answer",
    "Attempt",
    "BadRequest",
    "Cancel",
    "Detached",
    "ErrorAnswer",
    "Forget",
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
    "parse_answer_frame",
    "parse_outcome",
    "parse_request",
]

# Ids and tokens index tables on the other side; a token is `epoch << 32 | sequence`.
_MAX_ID = 2**63

MAX_EARLIER = 64
"""The most tokens an ``earlier`` field (of ``reassert`` and of a rejoining ``run``) holds:
the latest earlier tokens of a flight that retried (each attempt has a token of its own)."""


class BadRequest(Exception):
    """A well-formed request the coordinator cannot serve: an unknown ``op`` or a bad field.

    It is answered with an ``error`` frame carrying :attr:`id` (the request's integer id, or
    ``None``) and :attr:`message`; the connection stays open.
    """

    def __init__(self, id: int | None, message: str) -> None:
        super().__init__(message)
        self.id = id
        self.message = message


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
    taken: bool = False  # its connection hears `taken` when the ack waits (ADR 0040)


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
class Taken:
    """``taken``: the landing of the lead ``id`` was read and handed to its joiners; its
    ``ack`` follows once it left for every one of them (ADR 0040)."""

    id: int


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
    | Taken
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
    """An optional count: a Retention bound (``max_items``, ``max_bytes``; absent or
    null is none, the coordinator's own) or a timeout's ``attempts`` (absent or null:
    not said); else an integer in [1, 2**63)."""
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
        # ("attempts" is optional: absent or null, the joiners' error does not say it)
        return Timeout(_positive_field(header, "deadline"), _bound_field(header, "attempts"))
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
    return Land(
        _id_field(header, "id"),
        _id_field(header, "token"),
        _outcome(header, payload),
        _flag(header, "taken"),
    )


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


def _taken(header: Mapping[str, Any], payload: bytes | None) -> Taken:
    return Taken(_id_field(header, "id"))


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
    "taken": _taken,
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
