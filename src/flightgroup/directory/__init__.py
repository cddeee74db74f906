"""The directory scope: every process of a host that names one local directory
shares flights through a coordinator elected among them.

- ``fs``: the directory's files, the network file system check, the forgotten marks;
  ``epochs``: the epoch that numbers the coordinator's terms.
- ``wire``: the protocol (docs/directory-protocol.md): framing, messages, builders.
- ``coordinator``: the elected server's decisions: lead or join for the directory;
  on ``term`` (the flights one term knows, its tokens), ``reassert`` (a lead back after
  a failover), ``server`` (the socket and its connections), ``records`` (what it knows
  of each key) and ``lockwatch`` (waiting for a key's lock).
- ``client``: the arbiter a group uses (the Scope), on ``state`` (what its parts
  share), ``election`` (the campaign and the term), ``connection`` (connecting,
  reconnects, resends, on ``channel``), ``answers`` (the coordinator's answers),
  ``keylocks`` (a lead's key lock), ``leases`` (a lead's lease until its landing is
  acknowledged), ``outage`` (no coordinator of its version), ``closing`` and ``calls``
  (what it keeps of each call and lead).
- ``forked``: what a forked child lets go of.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..scope.interface import Scope

__all__ = ["open_scope"]


def open_scope(path: str, *, max_frame: int, reconnect_timeout: float) -> Scope:
    """The directory scope of ``path`` (its arguments checked by the group): nothing
    is created or started until its first call."""
    from . import forked
    from .client import DirectoryArbiter

    scope = DirectoryArbiter(path, max_frame=max_frame, reconnect_timeout=reconnect_timeout)
    forked.watch(path)  # a forked child lets go of this directory's locks
    return scope
