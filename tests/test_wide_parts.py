"""Parts the wide scopes share (flightgroup.wide), on their own, and the kept failure's
cause across groups of one directory."""

from __future__ import annotations

import pytest

from flightgroup import FlightFailedError, Retention
from flightgroup.wide import KeptCauses

from .ingroup import close, group


def test_kept_causes_are_found_by_key_and_token_and_bounded() -> None:
    causes = KeptCauses(limit=3)
    errors = [ValueError(i) for i in range(4)]
    for i, error in enumerate(errors):
        causes.remember("k", i, error, 60.0)
    assert causes.cause("k", 0) is None  # the oldest went past the bound
    assert [causes.cause("k", i) for i in (1, 2, 3)] == errors[1:]
    assert causes.cause("k", 4) is None and causes.cause("other", 3) is None
    causes.remember("k", 1, errors[0], 60.0)  # remembered again: the newest
    causes.remember("j", 9, errors[3], 60.0)
    assert causes.cause("k", 2) is None and causes.cause("k", 1) is errors[0]


def test_kept_causes_drop_an_error_whose_keep_time_ran_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("flightgroup.wide.time.monotonic", lambda: now[0])
    causes = KeptCauses()
    error = KeyError("gone")
    causes.remember("k", 1, error, 5.0)
    now[0] += 4.9
    assert causes.cause("k", 1) is error
    now[0] += 0.1
    assert causes.cause("k", 1) is None  # as the kept failure it explains


def test_a_kept_failure_led_in_another_group_has_no_cause(directory: str) -> None:
    # API.md: __cause__ only in the leader's process (a group is the unit here, as for
    # joiners: tests/test_directory_policies.py).
    a, b = (group(directory, retention=Retention(success=None, error=60.0)) for _ in "ab")
    try:

        def boom() -> None:
            raise KeyError("missing")

        with pytest.raises(KeyError):
            a.run_sync("k", boom)
        with pytest.raises(FlightFailedError) as other:
            b.run_sync("k", lambda: "never")
        with pytest.raises(FlightFailedError) as own:
            a.run_sync("k", lambda: "never")
        assert other.value.error_type == own.value.error_type == "KeyError"
        assert other.value.__cause__ is None
        assert isinstance(own.value.__cause__, KeyError)
    finally:
        close(a, b)
