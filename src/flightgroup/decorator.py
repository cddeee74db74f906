"""The decorator: ``FlightGroup.coalesce`` (and ``GroupSlot.coalesce``) turns a function
into an operation whose calls share flights by the key its arguments make, in a namespace
of its own.

Its types keep the function's signature (ParamSpec): a decorated coroutine function is
still awaited, a decorated method still binds; a ``key`` function is checked against the
function's parameters, and ``options(...)`` gives the per-call form that returns the
``Result`` (ADR 0044). Two decorated functions never share a flight: a key lives in its
function's namespace (``module.qualname``, a lambda's with its line and a digest of its
code, or ``name=``; ADR 0032).
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

from .codec import operation_codec
from .configure import check_call, check_key

if TYPE_CHECKING:
    from .engine.flight import Result
    from .policy import FlightPolicy

__all__ = [
    "BoundCoalesced",
    "Coalesced",
    "Operation",
    "check_key_takes_calls",
    "make_coalesce",
    "namespace_of",
]

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

    # The per-call form: a coroutine function's is awaited too; both give the Result.
    @overload
    def options(  # type: ignore[overload-overlap]
        self: Coalesced[Q, Coroutine[Any, Any, T]],
        *,
        on_join: Callable[[], object] | None = None,
        timeout: float | None = None,
        fresh: bool = False,
    ) -> Callable[Q, Coroutine[Any, Any, Result[T]]]: ...

    @overload
    def options(
        self: Coalesced[Q, T],
        *,
        on_join: Callable[[], object] | None = None,
        timeout: float | None = None,
        fresh: bool = False,
    ) -> Callable[Q, Result[T]]: ...

    def options(
        self,
        *,
        on_join: Callable[[], object] | None = None,
        timeout: float | None = None,
        fresh: bool = False,
    ) -> Any:
        """The function called with these options: called with the function's own
        arguments, it returns the call's ``Result`` (``value``, ``joined``, ``token``),
        awaited for a coroutine function. ``on_join``, ``timeout`` and ``fresh`` mean
        what they mean for ``FlightGroup.run`` / ``run_sync``; they are checked here."""
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
    ``forget`` and ``options`` are reached through the class, the instance first
    (``Cls.method.forget(instance, ...)``, ``Cls.method.options(...)(instance, ...)``)."""

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


def check_key_takes_calls(key: Callable[..., str], fn: Callable[..., Any]) -> None:
    """Raise TypeError, at decoration, when some call that ``fn``'s signature accepts would
    not bind to ``key``'s: too few or too many parameters, another name, a parameter
    the key requires where the function has a default. Each way to call is tried on the
    key's signature: positionally and by name, with and without the defaulted
    parameters, with one extra ``*args`` and ``**kwargs`` item where the function takes
    them. (Type checkers cannot see this: ADR 0044.) A callable without a signature is
    not checked."""
    try:
        key_signature, signature = inspect.signature(key), inspect.signature(fn)
    except (TypeError, ValueError):
        return
    kinds = inspect.Parameter
    for named in (False, True):
        for with_defaults in (True, False):
            args: list[object] = []
            kwargs: dict[str, object] = {}
            for parameter in signature.parameters.values():
                kind = parameter.kind
                if kind is kinds.VAR_POSITIONAL:
                    if not kwargs:  # (after a named parameter, no call passes more)
                        args.append(None)
                elif kind is kinds.VAR_KEYWORD:
                    kwargs["_flightgroup_extra_"] = None
                elif parameter.default is not kinds.empty and not with_defaults:
                    continue
                elif kind is kinds.KEYWORD_ONLY or (named and kind is kinds.POSITIONAL_OR_KEYWORD):
                    kwargs[parameter.name] = None
                elif not kwargs:  # positionally, while no parameter before it was named
                    args.append(None)
                else:
                    kwargs[parameter.name] = None
            try:
                key_signature.bind(*args, **kwargs)
            except TypeError as error:
                shown = ", ".join([*("…" for _ in args), *(f"{name}=…" for name in kwargs)])
                raise TypeError(
                    f"the key function{key_signature} cannot take every call of "
                    f"{getattr(fn, '__qualname__', fn)!s}{signature}: a call ({shown}) "
                    f"would fail in the key ({error})"
                ) from None


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


class Operation:
    """Where a GroupSlot's decorated function finds its group: ``bound`` is the pair
    (group, the operation's policy under that group), replaced whole when the slot is
    bound or unbound, so a call reads it once and never sees a group with another
    group's policy. Unbound, its group is the slot's stand-in that raises
    GroupClosedError."""

    __slots__ = ("__weakref__", "bound")

    def __init__(self, bound: tuple[Any, FlightPolicy]) -> None:
        self.bound = bound


def make_coalesce(
    group: Any,
    key: Callable[..., str] | None,
    name: str | None,
    policy: Any,
    new_operation: Callable[[Callable[..., Any], str], Operation] | None = None,
) -> Any:
    """The decorator ``group.coalesce(key, name=...)`` returns (``group`` a FlightGroup),
    its calls under ``policy``; or, with ``new_operation`` (a GroupSlot's), one whose
    decorated functions each read their group and policy from the Operation that
    ``new_operation(fn, namespace)`` makes for them."""

    def decorate(fn: Any) -> Any:
        if isinstance(fn, (classmethod, staticmethod)):  # above it: the same kind back
            return type(fn)(decorate(fn.__func__))
        if not callable(fn):
            raise TypeError("coalesce() decorates a function")
        namespace = name or namespace_of(fn)
        op_key = _key_maker(fn, key, namespace)
        is_async = inspect.iscoroutinefunction(inspect.unwrap(fn)) or (
            inspect.iscoroutinefunction(fn)
        )
        operation = None if new_operation is None else new_operation(fn, namespace)
        if operation is None:
            # A group's own operation: its codec made once, for its declared return type
            # (a typed codec). A slot's is made for each group it holds (GroupSlot.bind).
            op_policy = policy.with_codec(operation_codec(policy.codec, fn, namespace))
            wrapper = _fixed_wrapper(fn, op_key, group, op_policy, is_async=is_async)
            fixed = (group, op_policy)

            def current() -> tuple[Any, FlightPolicy]:
                return fixed
        else:
            wrapper = _late_wrapper(fn, op_key, operation, is_async=is_async)

            def current() -> tuple[Any, FlightPolicy]:
                return operation.bound

        def forget(*args: Any, **kwargs: Any) -> None:
            current()[0]._forget_op(op_key(args, kwargs)[0])

        wrapper.forget = forget
        wrapper.options = _options_maker(fn, op_key, current, is_async=is_async)
        wrapper.flight_namespace = namespace
        return wrapper

    return decorate


_OpKey = Callable[[tuple[Any, ...], dict[str, Any]], tuple[tuple[str, str], str]]


def _key_maker(fn: Any, key: Callable[..., str] | None, namespace: str) -> _OpKey:
    """What makes a call's keys from its arguments: the table's (namespace, key) and the
    key itself, checked. Without ``key``, the repr of the bound arguments; a ``key``
    that could not take some call ``fn`` accepts raises TypeError here."""
    if key is None:
        signature = inspect.signature(fn)

        def key_of(*args: Any, **kwargs: Any) -> str:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return repr(tuple(bound.arguments.items()))
    else:
        check_key_takes_calls(key, fn)
        key_of = key

    def op_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[str, str], str]:
        op = check_key(key_of(*args, **kwargs))
        return (namespace, op), op

    return op_key


def _fixed_wrapper(
    fn: Any, op_key: _OpKey, group: Any, policy: FlightPolicy, *, is_async: bool
) -> Any:
    """The decorated function of a group's own operation: its group and policy are the
    closure's."""
    if is_async:

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            tkey, op = op_key(args, kwargs)
            return (await group._run_op(tkey, op, lambda: fn(*args, **kwargs), policy)).value

        return async_wrapper

    @functools.wraps(fn)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        tkey, op = op_key(args, kwargs)
        if group._closed:
            raise group._closed_error()
        work = functools.partial(fn, *args, **kwargs)
        return group._call_sync(tkey, op, work, policy).value

    return sync_wrapper


def _late_wrapper(fn: Any, op_key: _OpKey, operation: Operation, *, is_async: bool) -> Any:
    """The decorated function of a GroupSlot's operation: it reads its group and policy
    from ``operation`` once per call (they change together)."""
    if is_async:

        @functools.wraps(fn)
        async def late_async_wrapper(*args: Any, **kwargs: Any) -> Any:
            tkey, op = op_key(args, kwargs)
            bound, policy = operation.bound
            return (await bound._run_op(tkey, op, lambda: fn(*args, **kwargs), policy)).value

        return late_async_wrapper

    @functools.wraps(fn)
    def late_sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        tkey, op = op_key(args, kwargs)
        bound, policy = operation.bound
        if bound._closed:
            raise bound._closed_error()
        work = functools.partial(fn, *args, **kwargs)
        return bound._call_sync(tkey, op, work, policy).value

    return late_sync_wrapper


def _options_maker(
    fn: Any,
    op_key: _OpKey,
    current: Callable[[], tuple[Any, FlightPolicy]],
    *,
    is_async: bool,
) -> Callable[..., Any]:
    """The decorated function's ``options(...)``: the options checked once, it returns
    the function that calls with them and gives the Result."""

    def options(
        *,
        on_join: Callable[[], object] | None = None,
        timeout: float | None = None,
        fresh: bool = False,
    ) -> Any:
        check_call(fn, on_join, timeout, fresh)
        call: Any
        if is_async:

            async def call_async(*args: Any, **kwargs: Any) -> Any:
                tkey, op = op_key(args, kwargs)
                bound, policy = current()
                return await bound._run_op_with(
                    tkey, op, lambda: fn(*args, **kwargs), policy,
                    on_join=on_join, timeout=timeout, fresh=fresh,
                )

            call = call_async
        else:

            def call_sync(*args: Any, **kwargs: Any) -> Any:
                tkey, op = op_key(args, kwargs)
                bound, policy = current()
                return bound._call_sync_with(
                    tkey, op, functools.partial(fn, *args, **kwargs), policy,
                    on_join=on_join, timeout=timeout, fresh=fresh,
                )

            call = call_sync
        return functools.wraps(fn)(call)

    return options
