"""The outcome of a flight as it crosses processes: what a leader lands and a joiner in
another process gets. Scope-neutral: the directory's wire and the fleet's Redis records
both carry these, and neither scope imports the other to speak of them.

Imports nothing from the rest of flightgroup, so a scope's wire format can build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

__all__ = ["Failure", "Interrupted", "SharedOutcome", "Timeout", "Value", "kept_size"]


@dataclass(frozen=True, slots=True)
class Value:
    """A flight's value: the codec's bytes, and how long the scope keeps it (seconds);
    when kept, the leader's Retention bounds on the group's kept outcomes."""

    data: bytes
    keep: float | None = None
    max_items: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A flight whose work raised: the exception's class, module and ``str()``; how long
    it is kept, and the leader's Retention bounds, as for a :class:`Value`."""

    type: str
    module: str
    message: str
    keep: float | None = None
    max_items: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Timeout:
    """A flight that ran past its deadline (seconds), after ``attempts`` attempts (None
    where the scope does not carry it)."""

    deadline: float
    attempts: int | None = None


@dataclass(frozen=True, slots=True)
class Interrupted:
    """A flight that ended without an outcome, and why."""

    reason: str


SharedOutcome: TypeAlias = Value | Failure | Timeout | Interrupted
"""Every ending a landing can carry."""


def kept_size(outcome: Value | Failure) -> int:
    """The bytes a kept outcome counts for against Retention.max_bytes, in every wide
    scope: a value's encoded bytes; a failure's type, module and message in UTF-8."""
    if isinstance(outcome, Value):
        return len(outcome.data)
    text = outcome.type + outcome.module + outcome.message
    return len(text.encode("utf-8", "surrogatepass"))
