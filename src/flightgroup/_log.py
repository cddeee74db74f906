"""The ``flightgroup`` logger, and how a key appears in logs and traces."""

from __future__ import annotations

import hashlib
import logging

__all__ = ["key_digest", "log"]

log = logging.getLogger("flightgroup")


def key_digest(key: str) -> str:
    """A key as logs and spans show it: the first 16 hex digits of its SHA-256 (keys
    can hold tenant ids; the raw key is never logged above DEBUG)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]
