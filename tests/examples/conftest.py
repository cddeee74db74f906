"""Fixtures of the recipes' tests: the children a test starts, stopped at its end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .servers import Children, Hold, held


@pytest.fixture
def children() -> Iterator[Children]:
    """Start children through this; each is stopped (SIGTERM, then SIGKILL) at the end."""
    started = Children()
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
def hold() -> Iterator[Hold]:
    """The folder the held works of the example servers record in (served/hold.py)."""
    with held() as h:
        yield h
