"""The key a flight has in a wide scope: a plain key as it is (or escaped), a decorated
function's carrying its namespace, so that the two kinds never meet there.
"""

from __future__ import annotations

from typing import cast

from .flight import WideFlight

__all__ = ["op_scope_key", "plain_scope_key", "scope_key"]


def scope_key(flight: WideFlight) -> str:
    """The key a flight has in a wide scope: a decorated function's keys carry its
    namespace ("NUL namespace NUL key"), so two functions never share a flight there
    either, nor a function and a plain key (see plain_scope_key)."""
    tkey = flight.tkey
    if type(tkey) is str:
        return plain_scope_key(tkey)
    namespace, op = cast("tuple[str, str]", tkey)  # a decorated function's
    return op_scope_key(namespace, op)


def op_scope_key(namespace: str, op: str) -> str:
    """The key a decorated function's call of ``op`` has in a wide scope."""
    return f"\x00{namespace}\x00{op}"


def plain_scope_key(key: str) -> str:
    """A plain key in a wide scope: as it is, unless it starts with a NUL; then it
    starts with one more. A decorated function's key starts with a NUL and then its
    namespace, which is never empty and holds no NUL, so the kinds never meet."""
    return "\x00" + key if key.startswith("\x00") else key
