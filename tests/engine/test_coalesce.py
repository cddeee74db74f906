"""The @coalesce decorator: shared runs per key, namespaced per function, typed."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from flightgroup import FlightGroup

from ..support import in_thread, mypy_strict, outcome, run, until, wait_until


def test_async_function_calls_with_equal_keys_share_one_run_and_return_the_value() -> None:
    g = FlightGroup()
    release = asyncio.Event()
    runs: list[int] = []

    @g.coalesce(key=lambda user_id: f"user:{user_id}")
    async def get_user(user_id: int) -> dict[str, int]:
        runs.append(user_id)
        await release.wait()
        return {"id": user_id}

    async def main() -> None:
        tasks = [asyncio.create_task(get_user(7)) for _ in range(5)]
        other = asyncio.create_task(get_user(8))
        await until(lambda: g.stats().calls == 6)
        release.set()
        values = await asyncio.gather(*tasks)
        assert values == [{"id": 7}] * 5 and all(v is values[0] for v in values)
        assert await other == {"id": 8}

    run(main())
    assert sorted(runs) == [7, 8]


def test_two_decorated_functions_never_share_a_flight_even_with_equal_keys() -> None:
    g = FlightGroup()
    release = asyncio.Event()

    @g.coalesce(key=lambda: "same")
    async def first() -> str:
        await release.wait()
        return "first"

    @g.coalesce(key=lambda: "same")
    async def second() -> str:
        await release.wait()
        return "second"

    async def main() -> None:
        a, b = asyncio.create_task(first()), asyncio.create_task(second())
        plain = asyncio.create_task(g.run("same", lambda: asyncio.sleep(0, "plain")))
        await until(lambda: g.stats().calls == 3)
        release.set()
        assert (await a, await b, (await plain).value) == ("first", "second", "plain")
        assert g.stats().joins == 0

    run(main())
    assert first.flight_namespace.endswith("first")


def test_name_sets_the_namespace_so_two_functions_can_share_on_purpose() -> None:
    g = FlightGroup()
    gate = threading.Event()

    @g.coalesce(key=lambda x: str(x), name="shared-op")
    def one(x: int) -> str:
        gate.wait(5)
        return "one"

    @g.coalesce(key=lambda x: str(x), name="shared-op")
    def two(x: int) -> str:
        return "two"

    results: list[str] = []
    thread = threading.Thread(target=lambda: results.append(one(1)))
    thread.start()
    wait_until(lambda: g.stats().calls == 1)
    joiner = threading.Thread(target=lambda: results.append(two(1)))
    joiner.start()
    wait_until(lambda: g.stats().joins == 1)
    gate.set()
    thread.join(5)
    joiner.join(5)
    assert results == ["one", "one"]


def test_sync_function_decorated_runs_once_for_concurrent_threads() -> None:
    g = FlightGroup()
    release = threading.Event()
    runs: list[int] = []

    @g.coalesce(key=lambda n: f"n:{n}")
    def compute(n: int) -> int:
        runs.append(n)
        release.wait(5)
        return n * n

    out: list[int] = []
    threads = [threading.Thread(target=lambda: out.append(compute(4))) for _ in range(8)]
    for t in threads:
        t.start()
    wait_until(lambda: g.stats().calls == 8)
    release.set()
    for t in threads:
        t.join(5)
    assert out == [16] * 8 and runs == [4]


def test_default_key_binds_arguments_so_positional_and_keyword_calls_share() -> None:
    g = FlightGroup()
    release = threading.Event()
    runs: list[tuple[int, int]] = []

    @g.coalesce()
    def add(a: int, b: int = 2) -> int:
        runs.append((a, b))
        release.wait(5)
        return a + b

    out: list[int] = []
    calls = [lambda: add(1), lambda: add(1, 2), lambda: add(a=1, b=2)]
    threads = [threading.Thread(target=lambda c=c: out.append(c())) for c in calls]
    for t in threads:
        t.start()
    wait_until(lambda: g.stats().calls == 3)
    release.set()
    for t in threads:
        t.join(5)
    assert out == [3, 3, 3] and runs == [(1, 2)]
    assert add(5) == 7


def test_decorator_keeps_name_doc_and_signature() -> None:
    g = FlightGroup()

    @g.coalesce(key=lambda user_id, *, fresh_copy=False: str(user_id))
    async def get_user(user_id: int, *, fresh_copy: bool = False) -> str:
        """Load a user."""
        return str(user_id)

    assert get_user.__name__ == "get_user"
    assert get_user.__doc__ == "Load a user."
    expected = "(user_id: 'int', *, fresh_copy: 'bool' = False) -> 'str'"
    assert str(inspect.signature(get_user)) == expected
    assert inspect.iscoroutinefunction(get_user)


def test_forget_on_the_wrapper_detaches_that_call_s_flight() -> None:
    g = FlightGroup()
    release = asyncio.Event()
    runs: list[int] = []

    @g.coalesce(key=lambda n: str(n))
    async def load(n: int) -> int:
        runs.append(n)
        await release.wait()
        return len(runs)

    async def main() -> None:
        first = asyncio.create_task(load(1))
        await until(lambda: runs == [1])
        load.forget(1)
        second = asyncio.create_task(load(1))
        await until(lambda: runs == [1, 1])
        release.set()
        assert {await first, await second} == {2}

    run(main())


def test_key_function_that_returns_a_non_string_is_a_type_error() -> None:
    g = FlightGroup()

    @g.coalesce(key=lambda n: n)
    def f(n: int) -> int:
        return n

    with pytest.raises(TypeError, match="key must be a str"):
        f(3)


def test_mypy_infers_the_decorated_function_s_return_type(tmp_path: Path) -> None:
    proc = mypy_strict(
        tmp_path,
        """
            import flightgroup

            g = flightgroup.FlightGroup()

            class User: ...

            @g.coalesce(key=lambda user_id: f"user:{user_id}")
            async def get_user(user_id: int) -> User:
                return User()

            @g.coalesce(key=lambda n: str(n))
            def square(n: int) -> int:
                return n * n

            async def main() -> None:
                user = await get_user(7)
                reveal_type(user)
                reveal_type(square(3))
                await get_user("seven")
        """,
    )
    out = proc.stdout
    assert 'Revealed type is "sample.User"' in out, out
    assert 'Revealed type is "int"' in out or 'Revealed type is "builtins.int"' in out, out
    # the parameters are kept too: a str where an int is due is an error
    assert 'has incompatible type "str"; expected "int"' in out, out




def test_mypy_binds_a_decorated_method_like_any_method(tmp_path: Path) -> None:
    """Read from an instance, a decorated method takes its arguments without self (it is
    not typed as the unbound function, which would make every correct call an error);
    read from the class, it is the function, and its forget takes the instance first."""
    proc = mypy_strict(
        tmp_path,
        """
            import flightgroup

            g = flightgroup.FlightGroup()

            class Repo:
                @g.coalesce(key=lambda self, user_id: f"user:{user_id}")
                async def get(self, user_id: int) -> str:
                    return "u"

                @g.coalesce(key=lambda self, n: str(n))
                def square(self, n: int) -> int:
                    return n * n

            async def main() -> None:
                repo = Repo()
                reveal_type(await repo.get(7))
                reveal_type(repo.square(3))
                reveal_type(Repo.square(repo, 3))
                Repo.square.forget(repo, 3)
                repo.square("three")
        """,
    )
    out = proc.stdout
    # (mypy names builtins short or long, depending on its version)
    assert out.count('type is "str"') + out.count('type is "builtins.str"') == 1, out
    assert out.count('type is "int"') + out.count('type is "builtins.int"') == 2, out
    # The one error is the bad argument: every correct call type-checks.
    assert out.count("error:") == 1, out
    assert 'Argument 1 to "__call__" of "BoundCoalesced" has incompatible type "str"' in out, out


def test_mypy_binds_a_coalesced_classmethod_and_staticmethod(tmp_path: Path) -> None:
    """Above @classmethod or @staticmethod, coalesce gives the same kind back (it
    refused them: "coalesce() decorates a function"). mypy reads a classmethod's other
    decorators as applied to the plain function, so it types a classmethod read from an
    instance and a staticmethod read from the class; read the other way, it keeps or
    drops the first parameter wrongly (docs/process-scope.md says so)."""
    proc = mypy_strict(
        tmp_path,
        """
            import flightgroup

            g = flightgroup.FlightGroup()

            class Svc:
                @g.coalesce(key=lambda cls, k: f"c:{k}")
                @classmethod
                async def load(cls, k: str) -> int:
                    return 1

                @g.coalesce(key=lambda k: f"s:{k}")
                @staticmethod
                def parse(k: str) -> bytes:
                    return b""

            async def main() -> None:
                reveal_type(await Svc().load("x"))
                reveal_type(Svc.parse("x"))
                await Svc().load(1)
        """,
    )
    out = proc.stdout
    assert out.count('type is "int"') + out.count('type is "builtins.int"') == 1, out
    assert out.count('type is "bytes"') + out.count('type is "builtins.bytes"') == 1, out
    assert out.count("error:") == 1, out
    assert 'has incompatible type "int"; expected "str"' in out, out


def test_coalesce_above_a_classmethod_or_staticmethod_shares_flights() -> None:
    g = FlightGroup()
    runs: list[str] = []
    gate = threading.Event()

    class Svc:
        @g.coalesce(key=lambda cls, k: k)
        @classmethod
        def load(cls, k: str) -> str:
            runs.append(f"{cls.__name__}:{k}")
            assert gate.wait(10)
            return k.upper()

        @g.coalesce(key=lambda k: k)
        @staticmethod
        def parse(k: str) -> str:
            return k * 2

    assert isinstance(Svc.__dict__["load"], classmethod)
    assert isinstance(Svc.__dict__["parse"], staticmethod)
    first, box = in_thread(Svc.load, "a")
    wait_until(lambda: bool(runs), "the first call leads")
    joined, other = in_thread(Svc().load, "a")
    wait_until(lambda: g.stats().joins == 1, "the second call joins")
    gate.set()
    first.join(10)
    joined.join(10)
    assert (outcome(box), outcome(other), runs) == ("A", "A", ["Svc:a"])
    assert Svc.parse("b") == Svc().parse("b") == "bb"
    Svc.__dict__["load"].__func__.forget(Svc, "a")


def test_a_decorated_method_runs_once_per_key_across_instances() -> None:
    g = FlightGroup()
    runs: list[int] = []

    class Repo:
        @g.coalesce(key=lambda self, n: str(n))
        def square(self, n: int) -> int:
            runs.append(n)
            return n * n

    repo = Repo()
    assert repo.square(3) == 9 and Repo().square(3) == 9 and runs == [3, 3]
    Repo.square.forget(repo, 3)  # through the class, the instance first
    assert repo.square(3) == 9


R = TypeVar("R")


def test_mypy_sees_the_decorated_function_s_forget(tmp_path: Path) -> None:
    """mypy --strict sees a decorated function's forget()."""
    proc = mypy_strict(
        tmp_path,
        """
            import flightgroup

            g = flightgroup.FlightGroup()

            @g.coalesce(key=lambda user_id: f"user:{user_id}")
            async def get_user(user_id: int) -> str:
                return "u"

            get_user.forget(7)
        """,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stdout


def _passthrough(fn: Callable[..., R]) -> Callable[..., R]:
    """A plain decorator of the everyday kind (logging, metrics): a def that returns
    whatever ``fn`` returns, with functools.wraps."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> R:
        return fn(*args, **kwargs)

    return wrapper


def test_coalesce_of_a_wrapped_async_function_is_awaitable() -> None:
    """coalesce of an async function wrapped by a plain decorator is awaitable."""
    g = FlightGroup()

    @g.coalesce(key=lambda n: str(n))
    @_passthrough
    async def load(n: int) -> int:
        return n * 2

    async def main() -> None:
        assert await load(21) == 42

    run(main())
