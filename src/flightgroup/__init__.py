"""flightgroup: single flight (request coalescing) for Python.

Callers that ask for the same key while its work runs do not start a second run:
they join the run in progress and get its outcome. See README.md and docs/api.md.
"""

from .codec import JSON as JSON
from .codec import PICKLE as PICKLE
from .codec import Codec as Codec
from .codec import _JSONCodec, _PickleCodec
from .errors import FlightError as FlightError
from .errors import FlightFailedError as FlightFailedError
from .errors import FlightInterruptedError as FlightInterruptedError
from .errors import FlightTimeoutError as FlightTimeoutError
from .errors import GroupClosedError as GroupClosedError
from .errors import LeaseLostError as LeaseLostError
from .errors import NetworkDirectoryError as NetworkDirectoryError
from .errors import ProtocolVersionError as ProtocolVersionError
from .errors import TooManyFlightsError as TooManyFlightsError
from .errors import TooManyWaitersError as TooManyWaitersError
from .errors import UnavailableError as UnavailableError
from .errors import ValueTooLargeError as ValueTooLargeError
from .group import FlightGroup as FlightGroup
from .group import Result as Result
from .lease import Lease as Lease
from .lease import current_lease as current_lease
from .policy import Limits as Limits
from .policy import Retention as Retention
from .policy import Retry as Retry
from .slot import GroupSlot as GroupSlot
from .stats import Stats as Stats

__version__ = "0.1.0"

__all__ = [
    "JSON",
    "PICKLE",
    "Codec",
    "FlightError",
    "FlightFailedError",
    "FlightGroup",
    "FlightInterruptedError",
    "FlightTimeoutError",
    "GroupClosedError",
    "GroupSlot",
    "Lease",
    "LeaseLostError",
    "Limits",
    "NetworkDirectoryError",
    "ProtocolVersionError",
    "Result",
    "Retention",
    "Retry",
    "Stats",
    "TooManyFlightsError",
    "TooManyWaitersError",
    "UnavailableError",
    "ValueTooLargeError",
    "current_lease",
]

# Tracebacks and reprs say flightgroup.Name, not the private module.
for _name in __all__:
    _obj = globals()[_name]
    if not isinstance(_obj, _JSONCodec | _PickleCodec):
        _obj.__module__ = __name__
del _name, _obj, _JSONCodec, _PickleCodec
