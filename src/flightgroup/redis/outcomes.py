"""An outcome as the fleet scope keeps it in Redis: the (code, payload) of a mailbox
entry or a kept record, and the bounds the kept index counts it by.

Codes: ``ok`` a value (its codec's bytes), ``err`` a failure (JSON: type, module,
message), ``tmo`` a timeout (its deadline), ``int`` an interruption (its reason), and
in a mailbox ``next`` a retry's new token (read by delivery, never decoded here).
"""

from __future__ import annotations

import json

from ..scope.outcome import Failure, Interrupted, SharedOutcome, Timeout, Value, kept_size

__all__ = ["decode_outcome", "encode_outcome", "kept_bounds"]


def encode_outcome(outcome: SharedOutcome) -> tuple[str, bytes, float]:
    """(code, payload, seconds to keep) of an outcome, as the mailbox holds it."""
    if isinstance(outcome, Value):
        return "ok", outcome.data, outcome.keep or 0.0
    if isinstance(outcome, Failure):
        body = {"type": outcome.type, "module": outcome.module, "message": outcome.message}
        return "err", json.dumps(body).encode(), outcome.keep or 0.0
    if isinstance(outcome, Timeout):
        return "tmo", repr(outcome.deadline).encode(), 0.0
    return "int", outcome.reason.encode(), 0.0


def kept_bounds(outcome: SharedOutcome) -> tuple[int, int, int]:
    """(size, max_items, max_bytes) of an outcome for the kept index (0: no bound).
    Size: a value's encoded bytes; a failure's, the UTF-8 bytes of its type, module
    and message (as the directory scope counts them)."""
    if not isinstance(outcome, (Value, Failure)):
        return 0, 0, 0
    return kept_size(outcome), outcome.max_items or 0, outcome.max_bytes or 0


def decode_outcome(code: bytes | None, payload: bytes | None) -> SharedOutcome:
    """The outcome of a mailbox entry (or a kept record); anything unreadable is an
    interruption, never a wrong value."""
    payload = payload if payload is not None else b""
    try:
        if code == b"ok":
            return Value(payload)
        if code == b"err":
            body = json.loads(payload)
            return Failure(str(body["type"]), str(body["module"]), str(body["message"]))
        if code == b"tmo":
            return Timeout(float(payload))
        if code == b"int":
            return Interrupted(payload.decode(errors="replace") or "its leader stopped")
    except (KeyError, TypeError, ValueError):
        pass
    return Interrupted("its outcome in Redis could not be read")
