"""The public names are exactly docs/api.md's, in one place, and the errors form one tree."""

from __future__ import annotations

import pickle

import pytest

import flightgroup
from flightgroup import errors

API_NAMES = {
    "FlightGroup", "Result", "Stats", "Lease", "current_lease",
    "Codec", "JSON", "PICKLE", "Retry", "Retention", "Limits",
    "FlightError", "FlightFailedError", "FlightInterruptedError", "FlightTimeoutError",
    "LeaseLostError", "TooManyWaitersError", "TooManyFlightsError",
    "ProtocolVersionError", "NetworkDirectoryError", "GroupClosedError", "ValueTooLargeError",
    "UnavailableError",
    "GroupSlot",  # issue 29: operations declared before their group (ADR 0044)
}  # fmt: skip


def test_all_is_the_api() -> None:
    assert set(flightgroup.__all__) == API_NAMES
    for name in API_NAMES:
        assert hasattr(flightgroup, name)


def test_public_classes_say_flightgroup_in_tracebacks() -> None:
    for name in API_NAMES - {"JSON", "PICKLE"}:
        assert getattr(flightgroup, name).__module__ == "flightgroup", name


@pytest.mark.parametrize("name", sorted(errors.__all__))
def test_every_error_derives_from_flight_error_and_pickles(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, flightgroup.FlightError)
    samples = {
        "FlightFailedError": ("k", "ValueError", "bad", "builtins"),
        "FlightInterruptedError": ("k",),
        "FlightTimeoutError": ("k", 1.5),
        "LeaseLostError": ("k",),
        "TooManyWaitersError": ("k", 3),
        "TooManyFlightsError": ("k", 3),
        "ValueTooLargeError": ("k", 10, 5),
        "ProtocolVersionError": (1, 2),
        "NetworkDirectoryError": ("/mnt/x", "nfs"),
        "GroupClosedError": (),
        "UnavailableError": ("redis is down",),
        "FlightError": ("x",),
    }
    error = cls(*samples[name])
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and str(copy) == str(error)
    assert copy.__dict__ == error.__dict__


def test_error_attributes() -> None:
    e = flightgroup.FlightFailedError("k", "ValueError", "bad")
    assert (e.key, e.error_type, e.message) == ("k", "ValueError", "bad")
    assert e.error_module == "builtins"
    assert flightgroup.TooManyWaitersError("k", 3).limit == 3
    v = flightgroup.ValueTooLargeError("k", 10, 5)
    assert (v.key, v.size, v.limit) == ("k", 10, 5)
    assert flightgroup.FlightTimeoutError("k", 2.0).deadline == 2.0
    p = flightgroup.ProtocolVersionError(1, 2)
    assert (p.ours, p.theirs) == (1, 2)
    n = flightgroup.NetworkDirectoryError("/mnt", "nfs")
    assert (n.directory, n.file_system) == ("/mnt", "nfs")


def test_lease_has_no_public_constructor() -> None:
    with pytest.raises(TypeError, match="no public constructor"):
        flightgroup.Lease()


def test_the_process_scope_imports_no_directory_machinery() -> None:
    """`import flightgroup` loads no fcntl/Unix-socket code: the directory scope's
    modules come with the first directory group, so the process scope imports anywhere."""
    import subprocess
    import sys

    code = (
        "import sys, flightgroup; g = flightgroup.FlightGroup(); "
        "print(sorted(m for m in sys.modules if m.startswith('flightgroup.directory')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == "[]"
