"""The ``flightgroup`` logger, and how a key appears in logs and traces."""

from __future__ import annotations

import hashlib
import logging

__all__ = ["DigestOf", "key_digest", "log"]

log = logging.getLogger("flightgroup")


def key_digest(key: str) -> str:
    """A key as logs and spans show it: the first 16 hex digits of its SHA-256 (keys
    can hold tenant ids; the raw key is never logged above DEBUG)."""
    # surrogatepass: a str key may hold a lone surrogate (a non-UTF-8 byte of argv
    # becomes one), and the scopes accept it; a plain encode() would raise inside a
    # log call on the directory's loop (the call would never end) and in a traced
    # call. Every other key's digest is the SHA-256 of its UTF-8.
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class DigestOf:
    """A key's digest, computed only if a log record is formatted (DEBUG lines are
    built on every lead, join and landing, and are mostly off)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __str__(self) -> str:
        return key_digest(self.key)
