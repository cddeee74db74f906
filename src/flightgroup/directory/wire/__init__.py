"""The directory protocol's one namespace: ``from flightgroup.directory import wire``, then
``wire.run_frame``, ``wire.parse_request``, ``wire.Landed``, ...

``docs/directory-protocol.md`` is the spec; this package is its only code. It does no I/O of
its own beyond reading from an :class:`asyncio.StreamReader`, holds no state, and imports
nothing from the rest of flightgroup but the scope-neutral outcomes it carries
(:mod:`flightgroup.scope.outcome`, re-exported here as the outcomes ``land`` and ``landed``
carry), so the coordinator and the client both build on it.

- :mod:`.framing`: the handshake lines, the frames, reading them, the limits, WireError.
- :mod:`.messages`: a dataclass per request and answer, their field checks and parsers.
- :mod:`.builders`: a function per message that makes its frame.

Design note:

- **Two kinds of peer error.** :class:`WireError` means the byte stream itself is broken (a
  length over the limit, a body that is not a JSON object with a string ``op``, a stream cut
  short): nothing after it can be trusted, so the connection closes. :class:`BadRequest` means
  a well-formed frame asked for something the coordinator does not understand: the stream is
  still in step, so the coordinator answers ``error`` and keeps the connection. On the client
  side every malformed answer is a :class:`WireError`: a coordinator that says nonsense is
  closed and reconnected to, never argued with.
- **Strict on what matters, lenient on the rest.** Ids and tokens are range-checked because
  they index tables on the other side; fields this version does not know are ignored, so a
  later version may add some without a new protocol version.
- **Cheap builders.** Every message is one small JSON header; a value's payload is appended as
  it is, never re-encoded, and each frame is one ``bytes`` so a caller writes it in one call.
"""

from __future__ import annotations

from ...scope.outcome import Failure as Failure
from ...scope.outcome import Interrupted as Interrupted
from ...scope.outcome import SharedOutcome as SharedOutcome
from ...scope.outcome import Timeout as Timeout
from ...scope.outcome import Value as Value
from .builders import ack_frame as ack_frame
from .builders import attempt_frame as attempt_frame
from .builders import cancel_frame as cancel_frame
from .builders import detached_frame as detached_frame
from .builders import error_frame as error_frame
from .builders import forget_frame as forget_frame
from .builders import interrupted_frame as interrupted_frame
from .builders import joined_frame as joined_frame
from .builders import land_frame as land_frame
from .builders import landed_frame as landed_frame
from .builders import lead_frame as lead_frame
from .builders import outcome_fields as outcome_fields
from .builders import reassert_frame as reassert_frame
from .builders import rejected_frame as rejected_frame
from .builders import run_frame as run_frame
from .builders import status_answer_frame as status_answer_frame
from .builders import status_frame as status_frame
from .builders import taken_frame as taken_frame
from .framing import DEFAULT_MAX_FRAME as DEFAULT_MAX_FRAME
from .framing import FIRST_LINE_LIMIT as FIRST_LINE_LIMIT
from .framing import HANDSHAKE_TIMEOUT as HANDSHAKE_TIMEOUT
from .framing import HELLO as HELLO
from .framing import PROTOCOL as PROTOCOL
from .framing import READ_SIZE as READ_SIZE
from .framing import SKIPPED as SKIPPED
from .framing import VERSION as VERSION
from .framing import WELCOME as WELCOME
from .framing import FrameSplitter as FrameSplitter
from .framing import FrameTooLarge as FrameTooLarge
from .framing import WireError as WireError
from .framing import decode_body as decode_body
from .framing import encode_frame as encode_frame
from .framing import error_line as error_line
from .framing import parse_answer as parse_answer
from .framing import parse_hello as parse_hello
from .framing import read_frame as read_frame
from .framing import read_line as read_line
from .framing import refusal_line as refusal_line
from .messages import MAX_EARLIER as MAX_EARLIER
from .messages import Ack as Ack
from .messages import Answer as Answer
from .messages import Attempt as Attempt
from .messages import BadRequest as BadRequest
from .messages import Cancel as Cancel
from .messages import Detached as Detached
from .messages import ErrorAnswer as ErrorAnswer
from .messages import Forget as Forget
from .messages import InterruptedAnswer as InterruptedAnswer
from .messages import Joined as Joined
from .messages import Land as Land
from .messages import Landed as Landed
from .messages import Lead as Lead
from .messages import Reassert as Reassert
from .messages import Rejected as Rejected
from .messages import Request as Request
from .messages import Run as Run
from .messages import Status as Status
from .messages import StatusAnswer as StatusAnswer
from .messages import Taken as Taken
from .messages import parse_answer_frame as parse_answer_frame
from .messages import parse_outcome as parse_outcome
from .messages import parse_request as parse_request

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FIRST_LINE_LIMIT",
    "HANDSHAKE_TIMEOUT",
    "HELLO",
    "MAX_EARLIER",
    "PROTOCOL",
    "READ_SIZE",
    "SKIPPED",
    "VERSION",
    "WELCOME",
    "Ack",
    "Answer",
    "Attempt",
    "BadRequest",
    "Cancel",
    "Detached",
    "ErrorAnswer",
    "Failure",
    "Forget",
    "FrameSplitter",
    "FrameTooLarge",
    "Interrupted",
    "InterruptedAnswer",
    "Joined",
    "Land",
    "Landed",
    "Lead",
    "Reassert",
    "Rejected",
    "Request",
    "Run",
    "SharedOutcome",
    "Status",
    "StatusAnswer",
    "Taken",
    "Timeout",
    "Value",
    "WireError",
    "ack_frame",
    "attempt_frame",
    "cancel_frame",
    "decode_body",
    "detached_frame",
    "encode_frame",
    "error_frame",
    "error_line",
    "forget_frame",
    "interrupted_frame",
    "joined_frame",
    "land_frame",
    "landed_frame",
    "lead_frame",
    "outcome_fields",
    "parse_answer",
    "parse_answer_frame",
    "parse_hello",
    "parse_outcome",
    "parse_request",
    "read_frame",
    "read_line",
    "reassert_frame",
    "refusal_line",
    "rejected_frame",
    "run_frame",
    "status_answer_frame",
    "status_frame",
    "taken_frame",
]
