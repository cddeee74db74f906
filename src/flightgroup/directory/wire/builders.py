"""The directory protocol's builders: one function per message, each returning one whole
frame (``run_frame``, ``land_frame``, ... ``error_frame``), and :func:`outcome_fields`, the
header fields and payload that carry an outcome.

Fields at their default are left out. The frames of every call's round trip (run, lead,
joined, a value's land and landed, ack, ...) are filled into byte templates: several times
cheaper than encoding a dict, and byte for byte what :func:`~.framing.encode_frame` makes
(the tests pin that). ``%d`` of an int is always a JSON integer, a float goes through
``_float``, a key through the JSON encoder's string path. A value's payload is appended as
it is, never re-encoded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...scope.outcome import Failure, Interrupted, SharedOutcome, Timeout, Value
from .framing import ENCODER, encode_frame, join_frame
from .messages import MAX_EARLIER

__all__ = [
    "ack_frame",
    "attempt_frame",
    "cancel_frame",
    "detached_frame",
    "error_frame",
    "forget_frame",
    "interrupted_frame",
    "joined_frame",
    "land_frame",
    "landed_frame",
    "lead_frame",
    "outcome_fields",
    "reassert_frame",
    "rejected_frame",
    "run_frame",
    "status_answer_frame",
    "status_frame",
]


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
        timeout: dict[str, Any] = {"outcome": "timeout", "deadline": outcome.deadline}
        if outcome.attempts is not None:
            timeout["attempts"] = outcome.attempts
        return timeout, None
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
    body = b'{"op":"run","id":%d,"key":%s' % (id, ENCODER.encode(key).encode())
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
    return join_frame(body + b"}")


def land_frame(id: int, token: int, outcome: SharedOutcome, *, taken: bool = False) -> bytes:
    """``land``: the outcome of the lead ``id``'s attempt ``token`` (``taken``: this
    connection hears ``taken`` when the ack waits for the joiners)."""
    if type(outcome) is Value:  # the common landing: no dict, no encoder
        head = b'{"op":"land","id":%d,"token":%d,"outcome":"value"%s%s}' % (
            id,
            token,
            _retention(outcome),
            b',"taken":true' if taken else b"",
        )
        return join_frame(head, outcome.data)
    fields, payload = outcome_fields(outcome)
    header: dict[str, Any] = {"op": "land", "id": id, "token": token, **fields}
    if taken:
        header["taken"] = True
    return encode_frame(header, payload)


def attempt_frame(id: int) -> bytes:
    """``attempt``: ask for a new token for the retry of the lead ``id``."""
    return join_frame(b'{"op":"attempt","id":%d}' % id)


def cancel_frame(id: int) -> bytes:
    """``cancel``: withdraw the request ``id``."""
    return join_frame(b'{"op":"cancel","id":%d}' % id)


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
    return join_frame(b'{"op":"status","id":%d}' % id)


def lead_frame(id: int, token: int) -> bytes:
    """``lead``: the request ``id`` leads with ``token``."""
    return join_frame(b'{"op":"lead","id":%d,"token":%d}' % (id, token))


def joined_frame(id: int, token: int, pid: int, age: float) -> bytes:
    """``joined``: the request ``id`` joined the flight ``token`` of ``pid``, ``age`` s old."""
    head = b'{"op":"joined","id":%d,"token":%d,"pid":%d,"age":%s}' % (id, token, pid, _float(age))
    return join_frame(head)


def landed_frame(id: int, token: int, outcome: SharedOutcome, kept: bool = False) -> bytes:
    """``landed``: the outcome of the flight ``token`` for the request ``id``."""
    if type(outcome) is Value:  # sent to every joiner: no dict, no encoder
        head = b'{"op":"landed","id":%d,"token":%d,"outcome":"value"%s,"kept":%s}' % (
            id,
            token,
            _retention(outcome),
            b"true" if kept else b"false",
        )
        return join_frame(head, outcome.data)
    fields, payload = outcome_fields(outcome)
    header = {"op": "landed", "id": id, "token": token, **fields, "kept": kept}
    return encode_frame(header, payload)


def interrupted_frame(id: int, reason: str) -> bytes:
    """``interrupted``: the flight the request ``id`` waited for ended without an outcome."""
    return encode_frame({"op": "interrupted", "id": id, "reason": reason})


def ack_frame(id: int) -> bytes:
    """``ack``: the landing of the lead ``id`` reached every joiner."""
    return join_frame(b'{"op":"ack","id":%d}' % id)


def taken_frame(id: int) -> bytes:
    """``taken``: the landing of the lead ``id`` was read; its ``ack`` waits for joiners."""
    return join_frame(b'{"op":"taken","id":%d}' % id)


def detached_frame(id: int) -> bytes:
    """``detached``: the flight of the request ``id`` is no longer its key's."""
    return join_frame(b'{"op":"detached","id":%d}' % id)


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
