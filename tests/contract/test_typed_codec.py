"""flightgroup.typed.TypedCodec: values come back as the declared type (every type issue
29 lists), a value that does not match is refused in the encode naming the operation and
the type, plain calls are untyped, and the core never needs msgspec."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import subprocess
import sys
import types
import uuid
from typing import Any, NamedTuple, TypedDict

import msgspec
import pytest

from flightgroup import FlightGroup
from flightgroup.typed import TypedCodec

from ..support import run


class Status(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class Totals(TypedDict):
    count: int
    amount: decimal.Decimal


class Span(NamedTuple):
    start: datetime.datetime
    end: datetime.datetime


@dataclasses.dataclass
class Entry:
    id: uuid.UUID
    status: Status
    payload: bytes
    note: str | None = None


@dataclasses.dataclass
class Everything:
    day: datetime.date
    span: Span
    totals: Totals
    entries: list[Entry]
    by_id: dict[int, Entry]
    pair: tuple[int, str]
    tags: set[str]
    code: int | str
    later: Everything | None = None


UTC = datetime.UTC
ENTRY = Entry(uuid.UUID(int=1), Status.OPEN, b"\x00\xff", None)
EVERYTHING = Everything(
    day=datetime.date(2026, 12, 2),
    span=Span(datetime.datetime(2026, 12, 2, 8, tzinfo=UTC),
              datetime.datetime(2026, 12, 2, 9, 30, tzinfo=UTC)),
    totals={"count": 2, "amount": decimal.Decimal("12.50")},
    entries=[ENTRY, Entry(uuid.UUID(int=2), Status.CLOSED, b"", "late")],
    by_id={1: ENTRY},
    pair=(1, "one"),
    tags={"a", "b"},
    code="x-1",
    later=None,
)
EVERYTHING.later = dataclasses.replace(EVERYTHING, code=7, later=None)


def round_trip(tp: Any, value: Any) -> Any:
    codec = TypedCodec().for_type(tp, name="test.op")
    return codec.decode(codec.encode(value))


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        pytest.param(Everything, EVERYTHING, id="dataclass-nested"),
        pytest.param(Totals, {"count": 1, "amount": decimal.Decimal("0.1")}, id="typeddict"),
        pytest.param(Span, EVERYTHING.span, id="namedtuple"),
        pytest.param(tuple[int, ...], (1, 2, 3), id="tuple"),
        pytest.param(set[int], {1, 2}, id="set"),
        pytest.param(frozenset[str], frozenset({"a"}), id="frozenset"),
        pytest.param(Status, Status.CLOSED, id="enum"),
        pytest.param(datetime.datetime, datetime.datetime(2026, 1, 1, tzinfo=UTC), id="datetime"),
        pytest.param(datetime.date, datetime.date(2026, 1, 1), id="date"),
        pytest.param(uuid.UUID, uuid.UUID(int=9), id="uuid"),
        pytest.param(decimal.Decimal, decimal.Decimal("1.10"), id="decimal"),
        pytest.param(bytes, b"\x00\x01", id="bytes"),
        pytest.param(dict[int, str], {1: "a", -2: "b"}, id="dict-int-keys"),
        pytest.param(int | None, None, id="optional-none"),
        pytest.param(int | str, "s", id="union"),
        pytest.param(list[Entry], [ENTRY], id="list-of-dataclasses"),
    ],
)
def test_a_value_comes_back_equal_and_of_the_declared_type(tp: Any, value: Any) -> None:
    """Each type issue 29 lists survives encode and decode with its type and value."""
    got = round_trip(tp, value)
    assert got == value
    assert type(got) is type(value)


def test_msgpack_keeps_the_types_too() -> None:
    """format="msgpack" is the binary wire form, with the same typed decode."""
    codec = TypedCodec(format="msgpack").for_type(Everything, name="test.op")
    data = codec.encode(EVERYTHING)
    assert codec.decode(data) == EVERYTHING
    assert data != TypedCodec().for_type(Everything, name="test.op").encode(EVERYTHING)


def test_a_value_not_of_the_type_is_refused_naming_the_operation_and_the_type() -> None:
    """encode checks the value against the type: TypeError, msgspec's error as cause."""
    codec = TypedCodec().for_type(tuple[int, str], name="reports.daily")
    with pytest.raises(TypeError, match=r"reports\.daily .*tuple\[int, str\]") as info:
        codec.encode((1, 2))
    assert isinstance(info.value.__cause__, msgspec.ValidationError)
    with pytest.raises(TypeError, match=r"reports\.daily .*object"):
        codec.encode(object())


def test_a_type_msgspec_cannot_decode_is_refused_when_the_codec_is_made() -> None:
    """A declared type the codec cannot serve fails at decoration, not at a call."""
    g = FlightGroup(codec=TypedCodec())

    def ambiguous() -> Entry | Everything:  # two dataclasses: msgspec cannot tell them
        return ENTRY

    with pytest.raises(TypeError, match=r"ambiguous.* cannot decode Entry \| Everything"):
        g.coalesce()(ambiguous)


def test_a_decorated_function_gets_its_return_type_the_leader_too() -> None:
    """A group's TypedCodec is made for each decorated function's return type."""
    g = FlightGroup(codec=TypedCodec())

    @g.coalesce()
    def everything() -> Everything:
        return EVERYTHING

    @g.coalesce()
    def pair() -> tuple[int, str]:
        return (1, "one")

    got = everything()
    assert got == EVERYTHING and got is not EVERYTHING
    assert type(got.span) is Span and type(got.pair) is tuple
    assert pair() == (1, "one")


def test_an_async_function_gets_its_awaited_type() -> None:
    """For an ``async def`` the declared (awaited) return type is the one decoded."""
    g = FlightGroup()

    @g.coalesce(codec=TypedCodec())
    async def span() -> Span:
        return EVERYTHING.span

    got = run(span())
    assert type(got) is Span and got == EVERYTHING.span


def test_a_plain_call_with_a_typed_codec_is_untyped() -> None:
    """run/run_sync declare no type: the typed codec then gives plain JSON values, and
    refuses what it cannot encode naming no type."""
    g = FlightGroup(codec=TypedCodec())
    assert g.run_sync("k", lambda: {"t": (1, 2)}).value == {"t": [1, 2]}
    with pytest.raises(TypeError, match="the work returned a value of type object"):
        g.run_sync("k", lambda: object())


def test_a_function_without_a_return_type_is_untyped() -> None:
    """No declared return type: the codec is the untyped one."""
    g = FlightGroup(codec=TypedCodec())

    @g.coalesce()
    def untyped():  # type: ignore[no-untyped-def]
        return (1, 2)

    assert untyped() == [1, 2]


def test_a_type_given_to_the_codec_wins_over_the_declared_one() -> None:
    """TypedCodec(tp) keeps its own type for every function it serves."""
    g = FlightGroup()

    @g.coalesce(codec=TypedCodec(tuple[int, int]))
    def loose() -> Any:
        return [1, 2]

    assert loose() == (1, 2)


def test_a_return_type_defined_after_the_function_is_resolved_at_the_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module that decorates a function above the class it returns: the forward
    reference is looked up at the first call, and the value has that class."""
    g = FlightGroup(codec=TypedCodec())
    made = types.ModuleType("forward_reference")
    monkeypatch.setitem(sys.modules, made.__name__, made)
    module = vars(made)
    module["g"] = g
    source = (
        "from __future__ import annotations\n"
        "import dataclasses\n"
        "@g.coalesce()\n"
        "def later() -> Later:\n"
        "    return Later(1)\n"
        "@dataclasses.dataclass\n"
        "class Later:\n"
        "    n: int\n"
    )
    exec(compile(source, "forward_reference.py", "exec"), module)
    got = module["later"]()
    assert type(got) is module["Later"] and got.n == 1


def test_a_parameter_annotation_only_type_checkers_see_does_not_matter() -> None:
    """Only the return annotation is read: a parameter's may name what is imported
    under TYPE_CHECKING alone."""
    g = FlightGroup(codec=TypedCodec())

    @g.coalesce(key=lambda session: "k")
    def spans(session: OnlyForTypeCheckers) -> list[Span]:  # type: ignore[name-defined]  # noqa: F821
        return [EVERYTHING.span]

    got = spans(None)
    assert got == [EVERYTHING.span] and type(got[0]) is Span


def test_a_return_type_never_defined_fails_the_call_naming_the_operation() -> None:
    """A return type that names nothing, even at the first call: a TypeError there."""
    g = FlightGroup(codec=TypedCodec())

    @g.coalesce(name="ops.missing")
    def missing() -> NeverDefined:  # type: ignore[name-defined]  # noqa: F821
        return 1

    with pytest.raises(TypeError, match=r"ops\.missing.*NeverDefined"):
        missing()


def test_the_core_imports_and_uses_json_without_msgspec() -> None:
    """flightgroup installs with no dependency: importing it and coalescing over JSON
    never imports msgspec."""
    code = (
        "import sys, flightgroup\n"
        "g = flightgroup.FlightGroup(codec=flightgroup.JSON)\n"
        "@g.coalesce()\n"
        "def f() -> tuple[int, int]:\n"
        "    return (1, 2)\n"
        "assert f() == [1, 2]\n"
        "assert 'msgspec' not in sys.modules, 'msgspec was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr


def test_without_msgspec_the_typed_module_says_which_extra_to_install() -> None:
    """Importing flightgroup.typed where msgspec is missing: ImportError naming the extra."""
    code = (
        "import sys\n"
        "sys.modules['msgspec'] = None  # as if it were not installed\n"
        "try:\n"
        "    import flightgroup.typed\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "flightgroup[typed]" in done.stdout
