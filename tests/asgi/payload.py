"""The 10 MB body the uvicorn tests stream: a digest chain, so any corruption shows."""

from __future__ import annotations

import hashlib

BIG = 10 * 1024 * 1024


def big_body() -> bytes:
    """BIG bytes of sha256 digests of counters, repeated."""
    block = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(2048))
    return (block * (BIG // len(block) + 1))[:BIG]
