"""CollapseRequests over a wide scope (the fake one: several "processes" in one): the
shared response crosses whole, as the middleware's own frame of bytes, whatever codec
the group has."""

from __future__ import annotations

import asyncio

import pytest

from flightgroup import JSON, PICKLE, Codec
from flightgroup.asgi import DEFAULT_MAX_BODY_BYTES, CollapseRequests
from flightgroup.testing import FakeCoordinator
from flightgroup.typed import TypedCodec

from .driver import Endpoint, Scope, call, request
from .test_collapse_rules import until

EVERY_BYTE = bytes(range(256)) * 64


def binary(scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], list[bytes]]:
    """A 207 with a binary header value and a body holding every byte value."""
    return 207, [(b"x-raw", b"\x01\xfe"), (b"content-type", b"application/octet-stream")], [
        EVERY_BYTE[:1000], EVERY_BYTE[1000:]]


@pytest.mark.parametrize(
    "codec", [JSON, PICKLE, TypedCodec()], ids=["json", "pickle", "typed"]
)
async def test_a_response_crosses_processes_whole(codec: Codec) -> None:
    """Callers in two "processes" share one run; the joiners in the other process get
    the status, the headers and every byte of the body."""
    fake = FakeCoordinator()
    endpoint = Endpoint(binary)
    groups = [fake.group(codec=codec), fake.group(codec=codec)]
    apps = [CollapseRequests(endpoint, group=g, role_header="x-flightgroup") for g in groups]
    tasks = [asyncio.ensure_future(call(apps[i % 2], request("/bin"))) for i in range(6)]
    await until(lambda: sum(g.stats().calls for g in groups) >= 6 and endpoint.started.is_set())
    endpoint.gate.set()
    answers = await asyncio.gather(*tasks)
    assert len(endpoint.runs) == 1
    assert {(a.status, a.body, a.header(b"x-raw")) for a in answers} == {
        (207, EVERY_BYTE, b"\x01\xfe")
    }
    assert sorted(a.header(b"x-flightgroup") or b"" for a in answers) == [b"joined"] * 5 + [
        b"led"]


async def test_a_response_over_the_limit_is_run_again_in_every_process() -> None:
    """Over max_body_bytes, the joiners of both "processes" run the app themselves."""
    fake = FakeCoordinator()
    endpoint = Endpoint(binary)
    groups = [fake.group(codec=JSON), fake.group(codec=JSON)]
    apps = [CollapseRequests(endpoint, group=g, max_body_bytes=100) for g in groups]
    tasks = [asyncio.ensure_future(call(apps[i % 2], request("/bin"))) for i in range(4)]
    await until(lambda: sum(g.stats().calls for g in groups) >= 4 and endpoint.started.is_set())
    endpoint.gate.set()
    answers = await asyncio.gather(*tasks)
    assert len(endpoint.runs) == 4
    assert all(a.complete and a.body == EVERY_BYTE for a in answers)


def test_the_body_limit_fits_what_the_group_carries() -> None:
    """The default limit shrinks to fit the group's max_value_bytes, whatever the
    group's codec (the middleware's frames cross as bytes); a limit the group cannot
    carry is refused."""

    async def app(scope: Scope, receive: object, send: object) -> None: ...

    fake = FakeCoordinator()
    mib = 1024 * 1024
    json_small = CollapseRequests(app, group=fake.group(codec=JSON, max_value_bytes=mib))
    pickle_small = CollapseRequests(app, group=fake.group(codec=PICKLE, max_value_bytes=mib))
    assert 0 < json_small.max_body_bytes == pickle_small.max_body_bytes < mib
    roomy = CollapseRequests(app, group=fake.group(codec=JSON, max_value_bytes=64 * mib))
    assert roomy.max_body_bytes == DEFAULT_MAX_BODY_BYTES
    with pytest.raises(ValueError, match="max_value_bytes"):
        CollapseRequests(app, group=fake.group(codec=JSON, max_value_bytes=mib),
                         max_body_bytes=mib)


async def test_headers_past_what_the_group_carries_make_the_joiners_run_it() -> None:
    """A response whose headers push its value past max_value_bytes is not shared: the
    joiners run the app themselves instead of failing."""
    fake = FakeCoordinator()
    huge = [(b"x-big-%d" % i, b"v" * 1000) for i in range(200)]  # 200 KB of headers
    endpoint = Endpoint(lambda scope: (200, huge, [b"ok"]))
    group = fake.group(codec=JSON, max_value_bytes=128 * 1024)
    app = CollapseRequests(endpoint, group=group)
    tasks = [asyncio.ensure_future(call(app, request("/h"))) for _ in range(3)]
    await until(lambda: group.stats().calls >= 3 and endpoint.started.is_set())
    endpoint.gate.set()
    answers = await asyncio.gather(*tasks)
    assert len(endpoint.runs) == 3
    assert all(a.status == 200 and a.body == b"ok" and len(a.headers) == 200 for a in answers)
