"""CollapseRequests in one process: which requests share a run, what they share, and
what each caller gets when the run cannot be shared."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence

import pytest

from flightgroup import FlightGroup, FlightTimeoutError, Limits, Retry, current_lease
from flightgroup.asgi import CollapseRequests, Receive, Scope, Send

from .driver import Answer, Endpoint, call, request


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition()`` holds (a hang fails the test fast)."""
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def fixed(
    body: bytes = b"hello", status: int = 200, headers: Sequence[tuple[bytes, bytes]] = ()
) -> Callable[[Scope], tuple[int, list[tuple[bytes, bytes]], list[bytes]]]:
    """A respond() that always answers the same."""
    return lambda scope: (status, [(b"content-type", b"text/plain"), *headers], [body])


async def herd(
    middleware: CollapseRequests,
    group: FlightGroup,
    endpoint: Endpoint,
    scopes: Sequence[Scope],
    *,
    collapsed: int,
    gone_after: dict[int, int] | None = None,
) -> list[Answer]:
    """Send every scope at once; release the endpoint once ``collapsed`` calls reached
    the group (they are all in their flights) and its first run started."""
    before = group.stats().calls
    tasks = [
        asyncio.ensure_future(
            call(middleware, scope, gone_after=(gone_after or {}).get(i))
        )
        for i, scope in enumerate(scopes)
    ]
    await until(lambda: group.stats().calls - before >= collapsed and endpoint.started.is_set())
    endpoint.gate.set()
    return list(await asyncio.gather(*tasks))


def roles(answers: Sequence[Answer]) -> list[bytes | None]:
    return sorted((a.header(b"x-flightgroup") or b"-") for a in answers)


async def test_identical_gets_share_one_run_and_name_their_roles() -> None:
    """Ten identical GETs run the app once; each gets its status, headers and body,
    and the role header says led once and joined nine times."""
    endpoint = Endpoint(fixed(b"report", 203, [(b"x-made", b"once")]))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group, role_header="X-FlightGroup")
    answers = await herd(app, group, endpoint, [request("/r")] * 10, collapsed=10)
    assert len(endpoint.runs) == 1
    assert {(a.status, a.body, a.header(b"x-made")) for a in answers} == {
        (203, b"report", b"once")
    }
    assert roles(answers) == [b"joined"] * 9 + [b"led"]


async def test_error_responses_are_shared_and_no_role_header_unless_asked() -> None:
    """A 503 from the app is shared like any response; without role_header no
    header is added."""
    endpoint = Endpoint(fixed(b"down", 503))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    answers = await herd(app, group, endpoint, [request("/r")] * 5, collapsed=5)
    assert len(endpoint.runs) == 1
    assert {(a.status, a.body) for a in answers} == {(503, b"down")}
    assert all(a.header(b"x-flightgroup") is None for a in answers)


async def test_only_the_named_methods_are_collapsed_each_apart() -> None:
    """GET and HEAD of one path are two flights; POSTs each run the app."""
    endpoint = Endpoint(fixed())
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    scopes = [request("/r", method=m) for m in ("GET", "GET", "HEAD", "HEAD", "POST", "POST")]
    answers = await herd(app, group, endpoint, scopes, collapsed=4)
    assert sorted(s["method"] for s in endpoint.runs) == ["GET", "HEAD", "POST", "POST"]
    assert all(a.status == 200 and a.body == b"hello" for a in answers)


async def test_path_and_query_and_host_make_the_key() -> None:
    """Requests that differ in path, query or Host never share a run."""
    endpoint = Endpoint(lambda s: (200, [], [s["path"].encode() + b"?" + s["query_string"]]))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    other_host = request("/a")
    other_host["headers"] = [(b"host", b"elsewhere")]
    scopes = [request("/a"), request("/a"), request("/b"), request("/a", query=b"x=1"),
              other_host]
    answers = await herd(app, group, endpoint, scopes, collapsed=5)
    assert len(endpoint.runs) == 4
    assert [a.body for a in answers] == [b"/a?", b"/a?", b"/b?", b"/a?x=1", b"/a?"]


async def test_vary_headers_join_the_key_and_others_do_not() -> None:
    """Requests share a run only when the vary headers are equal; other headers do
    not matter."""
    endpoint = Endpoint(lambda s: (200, [], [dict(s["headers"]).get(b"accept", b"none")]))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group, vary=("Accept",))
    scopes = [
        request("/r", headers=[(b"accept", b"text/html"), (b"user-agent", b"a")]),
        request("/r", headers=[(b"accept", b"text/html"), (b"user-agent", b"b")]),
        request("/r", headers=[(b"accept", b"application/json")]),
        request("/r"),
    ]
    answers = await herd(app, group, endpoint, scopes, collapsed=4)
    assert len(endpoint.runs) == 3
    assert [a.body for a in answers] == [b"text/html", b"text/html", b"application/json",
                                         b"none"]


@pytest.mark.parametrize("header", [b"authorization", b"cookie", b"proxy-authorization"])
async def test_credentials_are_never_shared_unless_in_vary(header: bytes) -> None:
    """Requests with Authorization / Cookie each run the app and get their own
    answer, even with equal values, while plain requests beside them share."""
    endpoint = Endpoint(lambda s: (200, [], [dict(s["headers"]).get(header, b"anonymous")]))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    scopes = [request("/me", headers=[(header, b"alice")]),
              request("/me", headers=[(header, b"alice")]),
              request("/me", headers=[(header, b"bob")]),
              request("/me"), request("/me")]
    answers = await herd(app, group, endpoint, scopes, collapsed=2)
    assert len(endpoint.runs) == 4
    assert [a.body for a in answers] == [b"alice", b"alice", b"bob", b"anonymous", b"anonymous"]


async def test_credentials_in_vary_share_by_digest_only() -> None:
    """With authorization in vary, equal tokens share a run, distinct ones do not, and
    the flight's key holds no token in clear."""
    keys: list[str] = []

    def respond(scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], list[bytes]]:
        keys.append(current_lease().key)
        return 200, [], [dict(scope["headers"])[b"authorization"]]

    endpoint = Endpoint(respond)
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group, vary=("authorization",))
    token = b"Bearer s3cret-token"
    scopes = [request("/me", headers=[(b"authorization", token)]),
              request("/me", headers=[(b"authorization", token)]),
              request("/me", headers=[(b"authorization", b"Bearer other")])]
    answers = await herd(app, group, endpoint, scopes, collapsed=3)
    assert len(endpoint.runs) == 2
    assert [a.body for a in answers] == [token, token, b"Bearer other"]
    assert all(b"s3cret" not in key.encode() and len(key) == 64 for key in keys)


@pytest.mark.parametrize(
    ("name", "value"),
    [(b"cache-control", b"no-cache"), (b"cache-control", b"max-age=0, No-Store"),
     (b"pragma", b"no-cache")],
)
async def test_a_client_that_says_no_cache_runs_the_app_alone(name: bytes, value: bytes) -> None:
    """A request with Cache-Control no-cache / no-store (or Pragma no-cache) runs the app
    itself, beside a running flight of the same request."""
    endpoint = Endpoint(fixed())
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    scopes = [request("/r"), request("/r"), request("/r", headers=[(name, value)])]
    answers = await herd(app, group, endpoint, scopes, collapsed=2)
    assert len(endpoint.runs) == 2
    assert all(a.body == b"hello" for a in answers)


async def test_a_request_with_a_body_runs_the_app_alone() -> None:
    """A GET that declares a body (Content-Length above 0 or Transfer-Encoding) is
    never collapsed; Content-Length: 0 is."""
    endpoint = Endpoint(fixed())
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    scopes = [request("/r"), request("/r", headers=[(b"content-length", b"0")]),
              request("/r", headers=[(b"content-length", b"3")]),
              request("/r", headers=[(b"transfer-encoding", b"chunked")])]
    answers = await herd(app, group, endpoint, scopes, collapsed=2)
    assert len(endpoint.runs) == 3
    assert all(a.body == b"hello" for a in answers)


def streamed(size: int, chunk: int) -> Callable[[Scope], tuple[int, list[tuple[bytes, bytes]],
                                                                list[bytes]]]:
    """A respond() that streams ``size`` bytes of a fixed pattern in ``chunk``s."""
    data = hashlib.sha256(b"pattern").digest() * (size // 32 + 1)
    data = data[:size]
    return lambda scope: (200, [], [data[i:i + chunk] for i in range(0, size, chunk)])


async def test_a_body_over_the_limit_is_not_shared_and_never_truncated() -> None:
    """A body over max_body_bytes streams whole to its leader; each joiner runs the app
    for itself and gets it whole too."""
    size = 100_000
    endpoint = Endpoint(streamed(size, 4096))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group, max_body_bytes=size - 1,
                           role_header="x-flightgroup")
    answers = await herd(app, group, endpoint, [request("/big")] * 4, collapsed=4)
    expected = streamed(size, size)(request())[2][0]
    assert len(endpoint.runs) == 4
    assert all(a.complete and a.body == expected for a in answers)
    # Only the leader's answer was collapsed; the joiners' own runs carry no role.
    assert roles(answers) == [b"-", b"-", b"-", b"led"]


async def test_a_body_at_the_limit_is_shared() -> None:
    """A body of exactly max_body_bytes is shared whole."""
    size = 100_000
    endpoint = Endpoint(streamed(size, 4096))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group, max_body_bytes=size)
    answers = await herd(app, group, endpoint, [request("/big")] * 4, collapsed=4)
    assert len(endpoint.runs) == 1
    assert all(a.complete and len(a.body) == size for a in answers)
    assert len({a.body for a in answers}) == 1


@pytest.mark.parametrize(
    "header", [(b"set-cookie", b"session=1"), (b"cache-control", b"private, max-age=9")]
)
async def test_a_response_for_one_client_is_not_shared(header: tuple[bytes, bytes]) -> None:
    """A response that sets a cookie or says private goes to its leader only; each
    joiner runs the app for itself."""
    endpoint = Endpoint(fixed(headers=[header]))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    answers = await herd(app, group, endpoint, [request("/r")] * 3, collapsed=3)
    assert len(endpoint.runs) == 3
    assert all(a.body == b"hello" and a.header(header[0]) == header[1] for a in answers)


async def test_the_leaders_disconnect_does_not_break_the_joiners() -> None:
    """The leader's client goes away after the response start: the run goes on and every
    joiner gets the whole body."""
    endpoint = Endpoint(streamed(50_000, 1000))
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    answers = await herd(app, group, endpoint, [request("/r")] * 4, collapsed=4,
                         gone_after={0: 1})
    expected = streamed(50_000, 50_000)(request())[2][0]
    assert len(endpoint.runs) == 1
    assert not answers[0].complete
    assert all(a.complete and a.body == expected for a in answers[1:])


async def test_a_joiners_cancel_withdraws_only_it() -> None:
    """Cancelling a joiner's call leaves the run and the other callers whole."""
    endpoint = Endpoint(fixed())
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    tasks = [asyncio.ensure_future(call(app, request("/r"))) for _ in range(3)]
    await until(lambda: group.stats().calls >= 3 and endpoint.started.is_set())
    tasks[2].cancel()
    await until(tasks[2].done)
    endpoint.gate.set()
    answers = await asyncio.gather(*tasks[:2])
    assert tasks[2].cancelled()
    assert len(endpoint.runs) == 1 and all(a.body == b"hello" for a in answers)


async def test_an_app_that_raises_before_its_response_fails_every_caller() -> None:
    """The leader raises the app's error (its server answers 500); each joiner gets a 500
    from the middleware; the next request runs the app again."""
    endpoint = Endpoint(fixed(), raises=RuntimeError("broken"), raise_after=0)
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    tasks = [asyncio.ensure_future(call(app, request("/r"))) for _ in range(3)]
    await until(lambda: group.stats().calls >= 3 and endpoint.started.is_set())
    endpoint.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and str(errors[0]) == "broken"
    assert sorted(r.status for r in results if isinstance(r, Answer)) == [500, 500]
    endpoint.raises = None
    assert (await call(app, request("/r"))).body == b"hello"
    assert len(endpoint.runs) == 2


async def test_an_app_that_raises_after_a_whole_response_shares_it() -> None:
    """An app that completed its response and then raised (as Starlette's error
    middleware does) shares the response; only the leader's call raises, for the log."""
    endpoint = Endpoint(fixed(b"oops", 500), raises=RuntimeError("logged"), raise_after=2)
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group)
    tasks = [asyncio.ensure_future(call(app, request("/r"))) for _ in range(3)]
    await until(lambda: group.stats().calls >= 3 and endpoint.started.is_set())
    endpoint.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [str(r) for r in results if isinstance(r, BaseException)] == ["logged"]
    assert [(r.status, r.body) for r in results if isinstance(r, Answer)] == [(500, b"oops")] * 2
    assert len(endpoint.runs) == 1


async def test_other_scopes_pass_through() -> None:
    """A websocket or lifespan scope goes to the app untouched."""
    seen: list[str] = []

    async def app(scope: Scope, receive: object, send: object) -> None:
        seen.append(scope["type"])

    middleware = CollapseRequests(app, group=FlightGroup())
    await middleware({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    await middleware({"type": "websocket", "headers": []}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan", "websocket"]


def test_bad_arguments_are_refused() -> None:
    """Bad arguments raise at construction."""
    group = FlightGroup()

    async def app(scope: Scope, receive: object, send: object) -> None: ...

    with pytest.raises(TypeError):
        CollapseRequests(app, group=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CollapseRequests(app, group=group, vary="accept")
    with pytest.raises(ValueError, match="vary"):
        CollapseRequests(app, group=group, vary=("bad header",))
    with pytest.raises(ValueError, match="max_body_bytes"):
        CollapseRequests(app, group=group, max_body_bytes=-1)
    with pytest.raises(ValueError, match="role_header"):
        CollapseRequests(app, group=group, role_header="x y")


class FirstRunHolds:
    """An app whose first run sends its start and a first chunk, then holds until
    ``rest`` is set; every later run answers at once. Each run records its number."""

    def __init__(self, content_type: bytes, first: bytes, rest: bytes) -> None:
        self.content_type = content_type
        self.first = first
        self.tail = rest
        self.runs = 0
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.rest = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        number = self.runs
        self.runs += 1
        self.started.set()
        await self.gate.wait()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", self.content_type)]})
        await send({"type": "http.response.body", "body": self.first,
                    "more_body": True})
        if number == 0:
            await self.rest.wait()
        await send({"type": "http.response.body", "body": self.tail})


@pytest.mark.parametrize(
    ("content_type", "first"),
    [(b"application/octet-stream", b"x" * 2000), (b"text/event-stream", b"data: 1\n\n")],
    ids=["over-the-limit", "event-stream"],
)
async def test_joiners_run_it_as_soon_as_the_response_cannot_be_shared(
    content_type: bytes, first: bytes
) -> None:
    """The joiners of a response that passes the limit (or is an event stream) run the
    app at once, while the leader's own response still streams; it ends whole."""
    endpoint = FirstRunHolds(content_type, first, b"end")
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group, max_body_bytes=1000)
    tasks = [asyncio.ensure_future(call(app, request("/s"))) for _ in range(3)]
    await until(lambda: group.stats().calls >= 3 and endpoint.started.is_set())
    endpoint.gate.set()
    joiners = await asyncio.gather(*tasks[1:])  # while the leader's run still holds
    assert not tasks[0].done() and endpoint.runs == 3
    assert all(a.complete and a.body == first + b"end" for a in joiners)
    endpoint.rest.set()
    leader = await tasks[0]
    assert leader.complete and leader.body == first + b"end"


async def test_a_run_past_the_groups_deadline_answers_504_to_joiners() -> None:
    """Under the group's deadline, a run that never answers ends: the leader raises
    FlightTimeoutError (its server answers 500), each joiner gets a 504."""
    endpoint = Endpoint(fixed())  # its gate is never set
    group = FlightGroup(deadline=0.2)
    app = CollapseRequests(endpoint, group=group)
    tasks = [asyncio.ensure_future(call(app, request("/r"))) for _ in range(3)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], FlightTimeoutError)
    assert [r.status for r in results[1:] if isinstance(r, Answer)] == [504, 504]
    assert len(endpoint.runs) == 1


async def test_a_retried_run_never_writes_a_second_response_to_its_leader() -> None:
    """Under the group's Retry, a first attempt that broke off mid-response is run
    again for the joiners; the leader's client keeps the cut response (its server
    closes it) and never gets a second one mixed in."""
    runs = 0
    gate = asyncio.Event()

    async def flaky(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal runs
        runs += 1
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part-", "more_body": True})
        if runs == 1:
            raise RuntimeError("broke off")
        await send({"type": "http.response.body", "body": b"whole"})

    group = FlightGroup(retry=Retry(attempts=2, backoff=0.0, jitter=False))
    app = CollapseRequests(flaky, group=group)
    tasks = [asyncio.ensure_future(call(app, request("/r"))) for _ in range(3)]
    await until(lambda: group.stats().calls >= 3 and runs == 1)
    gate.set()
    leader, *joiners = await asyncio.gather(*tasks)
    assert runs == 2
    assert (leader.body, leader.complete) == (b"part-", False)
    assert all((a.body, a.complete) == (b"part-whole", True) for a in joiners)


async def test_a_joiner_past_the_groups_max_waiters_gets_503() -> None:
    """A joiner refused by the group's Limits(max_waiters) answers 503; the others share
    the run."""
    endpoint = Endpoint(fixed())
    group = FlightGroup(limits=Limits(max_waiters=1))
    app = CollapseRequests(endpoint, group=group)
    tasks = [asyncio.ensure_future(call(app, request("/r"))) for _ in range(3)]
    await until(lambda: tasks[2].done() and group.stats().calls >= 2 and endpoint.started.is_set())
    endpoint.gate.set()
    answers = await asyncio.gather(*tasks)
    assert len(endpoint.runs) == 1
    assert sorted((a.status, a.body) for a in answers) == [
        (200, b"hello"), (200, b"hello"), (503, b"Service Unavailable")]


async def test_a_closed_group_lets_each_request_run_the_app() -> None:
    """Once the group is closed, every request runs the app itself instead of failing."""
    endpoint = Endpoint(fixed())
    endpoint.gate.set()
    group = FlightGroup()
    app = CollapseRequests(endpoint, group=group, role_header="x-flightgroup")
    group.close()
    answers = await asyncio.gather(*(call(app, request("/r")) for _ in range(3)))
    assert len(endpoint.runs) == 3
    assert all(a.body == b"hello" and a.header(b"x-flightgroup") is None for a in answers)


async def test_middlewares_with_their_own_namespaces_never_share() -> None:
    """Two middlewares over one group share equal requests only in one namespace."""
    first, second = Endpoint(fixed(b"first")), Endpoint(fixed(b"second"))
    group = FlightGroup()
    apps = [CollapseRequests(first, group=group),
            CollapseRequests(second, group=group, namespace="second-app")]
    tasks = [asyncio.ensure_future(call(apps[i % 2], request("/r"))) for i in range(4)]
    await until(lambda: group.stats().calls >= 4 and first.started.is_set()
                and second.started.is_set())
    first.gate.set()
    second.gate.set()
    answers = await asyncio.gather(*tasks)
    assert (len(first.runs), len(second.runs)) == (1, 1)
    assert [a.body for a in answers] == [b"first", b"second"] * 2
    with pytest.raises(ValueError):
        CollapseRequests(first, group=group, namespace="")
