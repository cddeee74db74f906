"""The decorator: ``FlightGroup.coalesce`` turns a function into an operation whose
calls share flights by the key its arguments make, in a namespace of its own.

Its types keep the function's signature (ParamSpec): a decorated coroutine function is
still awaited, a decorated method still binds. Two decorated functions never share a
flight: a key lives in its function's namespace (``module.qualname``, a lambda's with its
line and a digest of its code, or ``name=``; ADR 0032).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import types
from collections.abc import Callable, Coroutine
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    overload,
)

from .configure import check_key

if TYPE_CHECKING:
    from .group import FlightGroup
    from .policy import FlightPolicy

__all__ = ["BoundCoalesced", "Coalesced", "make_coalesce", "namespace_of"]

T = TypeVar("T")
R_co = TypeVar("R_co", covariant=True)
P = ParamSpec("P")
Q = ParamSpec("Q")
S = TypeVar("S")


class Coalesced(Protocol[P, R_co]):
    """A function decorated by ``FlightGroup.coalesce``: called as the original, plus
    ``forget(*args, **kwargs)`` (the next call with those arguments leads a new flight)
    and ``flight_namespace`` (the namespace its keys live in)."""

    flight_namespace: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def forget(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Detach the flight these arguments' key maps to (see FlightGroup.forget)."""
        ...

    # A decorated method: read from its class, it is the function (``forget`` takes
    # the instance first); read from an instance, it is bound like any method.
    @overload
    def __get__(self, instance: None, owner: type[Any], /) -> Self: ...

    @overload
    def __get__(
        self: Coalesced[Concatenate[S, Q], R_co], instance: S, owner: type[Any], /
    ) -> BoundCoalesced[Q, R_co]: ...

    def __get__(self, instance: Any, owner: type[Any], /) -> Any: ...


class BoundCoalesced(Protocol[P, R_co]):
    """A decorated method read from an instance: called as the bound method. Its
    ``forget`` is reached through the class (``Cls.method.forget(instance, ...)``)."""

    flight_namespace: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...


class _Coalesce(Protocol):
    """The decorator returned by ``FlightGroup.coalesce``. Above ``@classmethod`` or
    ``@staticmethod`` it decorates their function and gives the same kind back (so
    type checkers bind ``cls`` as for any classmethod; its ``forget`` is reached as
    ``Cls.__dict__[name].__func__.forget``)."""

    @overload
    def __call__(self, fn: classmethod[S, P, T], /) -> classmethod[S, P, T]: ...

    @overload  # first: a staticmethod is callable too
    def __call__(  # type: ignore[overload-overlap]
        self, fn: staticmethod[P, T], /
    ) -> staticmethod[P, T]: ...

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, T]], /
    ) -> Coalesced[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __call__(self, fn: Callable[P, T], /) -> Coalesced[P, T]: ...



def namespace_of(fn: Callable[..., Any]) -> str:
    """``fn``'s namespace: its module and qualified name (docs/api.md). Every lambda of a
    scope has the qualified name ``<lambda>``, so a lambda's adds its first line and a
    digest of its code: two lambdas never share flights unless they are the same code
    at the same place, and one lambda has the same namespace in every process that runs
    its source on the same Python (ADR 0032)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(
            f"coalesce() needs name= for a {type(fn).__name__} (it has no module and "
            "qualified name to make its keys' namespace from)"
        )
    if qualname.endswith("<lambda>"):
        code = getattr(inspect.unwrap(fn), "__code__", None)
        if isinstance(code, types.CodeType):
            return f"{module}.{qualname}@{code.co_firstlineno}:{_code_digest(code)}"
    return f"{module}.{qualname}"


def _code_digest(code: types.CodeType) -> str:
    """A digest of what ``code`` does, the same in every process of one Python version:
    its bytecode, names and constants, nested code objects by their own content (their
    repr holds an address), a frozenset's members in sorted order (its repr's order
    follows the string hash, which differs between processes). The line is left out:
    lines typed at a prompt or in a notebook's cells all start at 1."""
    digest = hashlib.blake2b(digest_size=8)

    def feed(value: object) -> None:
        if isinstance(value, types.CodeType):
            digest.update(b"c" + value.co_code)
            for part in (value.co_names, value.co_varnames, value.co_freevars, value.co_consts):
                feed(part)
        elif isinstance(value, tuple):
            digest.update(b"(%d" % len(value))
            for item in value:
                feed(item)
        elif isinstance(value, frozenset):
            digest.update(b"{%d" % len(value))
            for text in sorted(repr(item) for item in value):
                digest.update(text.encode() + b"\0")
        else:
            digest.update(repr(value).encode() + b"\0")

    feed(code)
    return digest.hexdigest()


def make_coalesce(
    group: FlightGroup, key: Callable[..., str] | None, name: str | None, policy: FlightPolicy
) -> Any:
    """The decorator ``group.coalesce(key, name=...)`` returns, its calls under ``policy``."""

    def decorate(fn: Any) -> Any:
        if isinstance(fn, (classmethod, staticmethod)):  # above it: the same kind back
            return type(fn)(decorate(fn.__func__))
        if not callable(fn):
            raise TypeError("coalesce() decorates a function")
        namespace = name or namespace_of(fn)
        if key is None:
            signature = inspect.signature(fn)

            def key_of(*args: Any, **kwargs: Any) -> str:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                return repr(tuple(bound.arguments.items()))
        else:
            key_of = key

        def op_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[str, str], str]:
            op = check_key(key_of(*args, **kwargs))
            return (namespace, op), op

        if inspect.iscoroutinefunction(inspect.unwrap(fn)) or inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                tkey, op = op_key(args, kwargs)
                return (await group._run_op(tkey, op, lambda: fn(*args, **kwargs), policy)).value

            wrapper: Any = async_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                tkey, op = op_key(args, kwargs)
                if group._closed:
                    raise group._closed_error()
                work = functools.partial(fn, *args, **kwargs)
                return group._call_sync(tkey, op, work, policy).value

            wrapper = sync_wrapper

        def forget(*args: Any, **kwargs: Any) -> None:
            group._forget_op(op_key(args, kwargs)[0])

        wrapper.forget = forget
        wrapper.flight_namespace = namespace
        return wrapper

    return decorate
