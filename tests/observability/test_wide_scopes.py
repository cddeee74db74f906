"""Observability in the wide scopes, as each group (its own participant) sees a flight led
by one of them.

- Logs: the directory scope's failover (INFO), refused peers (another user: WARNING; a
  bad hello or another protocol version: INFO), a lost directory lease (WARNING) and a
  request that broke the coordinator's parser (WARNING, the exception's type only): each
  record exists at its level, and no record at INFO or above holds the raw key, none at
  all the value (both carry a marker string).
- ``stats()`` in the directory and fleet scopes: calls, flights, joins, failures,
  in_flight.
- OpenTelemetry: a decorated function's join spans carry the token and the link; a
  directory group's spans say ``scope="directory"``, and its join of a flight led in
  another process carries that flight's token.
- Prometheus: a directory group's counters after a flight across groups, and a lost
  directory lease counted in ``lease_losses``.

A directory lease is lost in this process: its coordinator (a child) is killed while the
test holds the election lock, so no coordinator serves for ``reconnect_timeout``. This
process's group must not take the election meanwhile (a child is kept from it by
SIGSTOP): its campaign is held back by an event (``held_campaign``) until the test lets
it go.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

import flightgroup
from flightgroup import JSON, FlightFailedError, FlightGroup, LeaseLostError, Stats
from flightgroup._log import key_digest
from flightgroup.directory import fs, wire
from flightgroup.directory.election import Election
from flightgroup.otel import instrument
from flightgroup.prometheus import register

from ..dirproc import Harness, RawConn
from ..support import once_reachable, until, wait_until

MARK = "qx7AUDITqx7"


KEY = f"tenant:{MARK}:key"  # a key that holds a tenant id


VALUE = f"{MARK}:value"


SYSTEM_PYTHON = "/usr/bin/python3"  # a Python the user nobody may run (stdlib only)


@pytest.fixture
def held_campaign(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Directory groups made in this process during the test campaign only once the
    event is set (set at the end of the test at the latest)."""
    allow = threading.Event()
    campaign = Election.campaign

    def held(self: Election) -> None:
        allow.wait()
        campaign(self)

    monkeypatch.setattr(Election, "campaign", held)
    try:
        yield allow
    finally:
        allow.set()


def record_text(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info:
        text += logging.Formatter().formatException(record.exc_info)
    return text


def assert_private(records: list[logging.LogRecord]) -> None:
    """No record holds the value; none at INFO or above holds the raw key."""
    assert records
    for record in records:
        text = record_text(record)
        assert VALUE not in text, text
        if record.levelno >= logging.INFO:
            assert MARK not in text, text


def said(records: list[logging.LogRecord], words: str) -> list[logging.LogRecord]:
    return [r for r in records if words in r.getMessage()]


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def sample(registry: CollectorRegistry, name: str, group: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"group": group, **labels})
    assert value is not None, f"{name} of {group} is not exported"
    return value


def herd(
    a: FlightGroup, b: FlightGroup, n: int, m: int, fail: bool = False
) -> tuple[dict[str, list[Any]], tuple[Stats, Stats]]:
    """``n`` calls of KEY in ``a`` (the first leads) and ``m`` in ``b``, every one of them
    in the flight (its on_join ran) before the work ends. Returns each group's outcomes
    (a Result or the exception) and both groups' stats while the flight ran."""
    started, gate = threading.Event(), threading.Event()
    joined = threading.Semaphore(0)

    def work() -> str:
        started.set()
        assert gate.wait(20)
        if fail:
            raise ValueError("the work failed")
        return VALUE

    outcomes: dict[str, list[Any]] = {"a": [], "b": []}

    def call(group: FlightGroup, name: str) -> None:
        try:
            outcomes[name].append(group.run_sync(KEY, work, on_join=joined.release))
        except Exception as exc:
            outcomes[name].append(exc)

    threads = [threading.Thread(target=call, args=(a, "a"))]
    threads[0].start()
    try:
        assert started.wait(20)
        threads += [threading.Thread(target=call, args=(a, "a")) for _ in range(n - 1)]
        threads += [threading.Thread(target=call, args=(b, "b")) for _ in range(m)]
        for thread in threads[1:]:
            thread.start()
        for _ in range(n - 1 + m):
            assert joined.acquire(timeout=20), "a call did not join"
        during = (a.stats(), b.stats())
    finally:
        gate.set()
        for thread in threads:
            thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes, during


@pytest.fixture(params=["directory", "fleet"])
def pair(request: pytest.FixtureRequest, directory: str) -> Iterator[tuple[str, Any]]:
    """(scope, make): ``make()`` is a new group on one directory or one fleet namespace."""
    groups: list[FlightGroup] = []
    if request.param == "fleet":
        server = request.getfixturevalue("redis_server")
        namespace = request.getfixturevalue("namespace")

        def make() -> FlightGroup:
            groups.append(FlightGroup(redis=server.url, namespace=namespace, codec=JSON))
            return groups[-1]
    else:

        def make() -> FlightGroup:
            groups.append(FlightGroup(directory=directory, codec=JSON))
            return groups[-1]

    try:
        yield request.param, make
    finally:
        for group in groups:
            group.close()


@pytest.mark.timeout(60)
def test_a_directory_failover_is_said_at_info_without_the_key(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory failover is said at INFO, without the key."""
    a = h.spawn_warm("a")
    assert h.coordinator_pid() == a.pid
    group = FlightGroup(directory=h.dir, codec=JSON)
    started, gate = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert gate.wait(20)
        return VALUE

    out: list[Any] = []
    with caplog.at_level(logging.DEBUG, logger="flightgroup"):
        thread = threading.Thread(target=lambda: out.append(group.run_sync(KEY, work)))
        thread.start()
        try:
            assert started.wait(20)
            a.call("j", KEY, h.work())  # the coordinator's own process joins: it knows KEY
            a.expect("joined", "j")
            a.kill()
            # This process is the only one left: it is elected and serves.
            assert h.coordinator_pid(not_pid=a.pid) == os.getpid()
            gate.set()
            thread.join(20)
        finally:
            gate.set()
            thread.join(20)
            group.close()
    assert out and out[0].value == VALUE and not out[0].joined
    assert h.epoch() == 2
    lost = said(caplog.records, "lost the coordinator")
    assert lost and all(r.levelno == logging.INFO for r in lost), lost
    elected = said(caplog.records, "coordinating")
    assert [r.levelno for r in elected] == [logging.INFO]
    assert "epoch 2" in elected[0].getMessage()
    assert_private(caplog.records)


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    os.getuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason="a peer of another user needs root (to run it as nobody) and a system Python",
)
def test_a_peer_of_another_user_is_refused_at_warning(
    directory: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer of another user is refused with a WARNING."""
    peer = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.settimeout(20)\n"
        "s.connect(sys.argv[1])\n"
        "try:\n"
        "    s.sendall(b'{\"protocol\":\"flightgroup\",\"version\":1}\\n')\n"
        "except OSError:\n"  # refused as it connected: the answer is there to read
        "    pass\n"
        "data = b''\n"
        "while b'\\n' not in data:\n"
        "    chunk = s.recv(4096)\n"
        "    if not chunk:\n"
        "        break\n"
        "    data += chunk\n"
        "sys.stdout.write(data.decode())\n"
    )
    sock = fs.socket_path(directory)
    with caplog.at_level(logging.DEBUG, logger="flightgroup"):
        with FlightGroup(directory=directory, codec=JSON) as group:
            assert group.run_sync(KEY, lambda: VALUE).value == VALUE  # it coordinates
            # Let nobody reach the socket (the scope made it 0600 in a 0700 directory):
            # only the coordinator's check of the peer's uid stands in the way.
            for path in (os.path.dirname(directory), directory):
                os.chmod(path, 0o711)
            os.chmod(sock, 0o666)
            proc = subprocess.run(
                [SYSTEM_PYTHON, "-c", peer, sock], user=65534, group=65534, extra_groups=[],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            assert group.run_sync("after", lambda: 2).value == 2  # it serves on
    assert '"ok":false' in proc.stdout and "uid 65534" in proc.stdout, proc.stdout
    refused = said(caplog.records, "refused a peer of uid 65534")
    assert [r.levelno for r in refused] == [logging.WARNING]
    assert_private(caplog.records)


@pytest.mark.timeout(60)
def test_peers_refused_for_their_hello_are_said_at_info(
    directory: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Peers refused for their hello (bad, another version) are said at INFO."""
    with caplog.at_level(logging.DEBUG, logger="flightgroup"):
        with FlightGroup(directory=directory, codec=JSON) as group:
            assert group.run_sync(KEY, lambda: VALUE).value == VALUE  # it coordinates
            sock = fs.socket_path(directory)
            with RawConn(sock) as conn:
                line = conn.hello(f"GET /{KEY} HTTP/1.1\n".encode())
                assert b"not a flightgroup hello" in line, line
                conn.closed_by_peer()
            with RawConn(sock) as conn:
                assert conn.hello(b'{"protocol":"flightgroup","version":2}\n') == (
                    wire.refusal_line()
                )
                conn.closed_by_peer()
            assert group.run_sync("after", lambda: 2).value == 2
    for words in ("is not a flightgroup hello", "speaks protocol version 2"):
        refused = said(caplog.records, words)
        assert [r.levelno for r in refused] == [logging.INFO], (words, refused)
        assert f"pid {os.getpid()}" in refused[0].getMessage()
    assert_private(caplog.records)


@pytest.mark.timeout(60)
def test_a_request_that_breaks_the_parser_is_logged_without_its_content(
    directory: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that breaks the parser is logged by its exception's type, not its content.

    The coordinator logs an unforeseen parser exception by its type only: its %r would quote the
    request (here a KeyError of the key, as a missing-field bug would raise)."""
    parse = wire.parse_request

    def broken(header: dict[str, Any], payload: bytes | None) -> wire.Request:
        if MARK in str(header.get("key")):
            raise KeyError(header["key"])
        return parse(header, payload)

    with caplog.at_level(logging.DEBUG, logger="flightgroup"):
        with FlightGroup(directory=directory, codec=JSON) as group:
            assert group.run_sync("before", lambda: 1).value == 1  # it coordinates
            monkeypatch.setattr(wire, "parse_request", broken)
            with RawConn(fs.socket_path(directory)) as conn:
                assert conn.hello() == wire.WELCOME
                conn.send(wire.run_frame(1, KEY))
                conn.closed_by_peer()  # that peer only is dropped
            assert group.run_sync("after", lambda: 2).value == 2
    [record] = said(caplog.records, "broke the parser")
    assert record.levelno == logging.WARNING
    assert "KeyError at test_wide_scopes.py:" in record.getMessage()  # type, where
    assert_private(caplog.records)


def lose_a_directory_lease(
    h: Harness, group: FlightGroup, allow: threading.Event,
    refused: list[BaseException] | None = None,
) -> BaseException | None:
    """``group`` (this process, its campaign held back) leads KEY under a child's
    coordinator; the child is killed and the test holds the election, so no coordinator
    serves for the group's reconnect_timeout: the lease is lost. Then the election is
    given back and the group may campaign: it serves again (the calls made before it
    does are refused at once: ``refused``). Returns the call's error."""
    a = h.spawn_warm("a")
    started = threading.Event()
    errors: list[BaseException | None] = []

    def work() -> str:
        started.set()
        lease = flightgroup.current_lease()
        asyncio.run(lease.wait_lost())
        return VALUE

    def call() -> None:
        try:
            group.run_sync(KEY, work)
        except BaseException as exc:
            errors.append(exc)
        else:
            errors.append(None)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        assert started.wait(20)
        a.kill()
        fd = h.take_election()  # nobody will serve
        thread.join(20)
        assert not thread.is_alive()
        h.give_back_election(fd)
    finally:
        allow.set()
        thread.join(20)
    # (refused at once until this group hears a coordinator again)
    call = lambda: group.run_sync("after", lambda: 2, timeout=20)  # noqa: E731
    assert once_reachable(call, refused).value == 2
    return errors[0]


@pytest.mark.timeout(60)
def test_a_lost_directory_lease_is_said_at_warning_without_the_key(
    h: Harness, held_campaign: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    """A lost directory lease is said at WARNING, without the key."""
    with caplog.at_level(logging.DEBUG, logger="flightgroup"):
        group = FlightGroup(directory=h.dir, codec=JSON, reconnect_timeout=1)
        try:
            error = lose_a_directory_lease(h, group, held_campaign)
        finally:
            group.close()
    assert isinstance(error, LeaseLostError)
    lost = said(caplog.records, "lost the lease of a flight")
    assert [r.levelno for r in lost] == [logging.WARNING]
    assert "no coordinator could be reached" in lost[0].getMessage()
    assert key_digest(KEY) in lost[0].getMessage()  # which flight, by digest
    failover = said(caplog.records, "lost the coordinator")
    assert failover and all(r.levelno == logging.INFO for r in failover)
    assert_private(caplog.records)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fail", [False, True], ids=["value", "failure"])
def test_stats_of_the_leading_and_the_joining_group(pair: tuple[str, Any], fail: bool) -> None:
    """stats() of the leading and the joining group each count their own calls.

    Each group is its own participant and counts its own calls: the leading one its
    flight and its joins, the joining one only joins (its first call, which asked the
    scope, too); a failure is counted in both views."""
    _scope, make = pair
    a, b = make(), make()
    outcomes, (a_during, b_during) = herd(a, b, n=3, m=4, fail=fail)
    assert (a_during.in_flight, b_during.in_flight) == (1, 1)
    assert (a_during.calls, b_during.calls) == (3, 4)
    if fail:
        assert sorted(type(e).__name__ for e in outcomes["a"]) == [
            "FlightFailedError", "FlightFailedError", "ValueError",
        ]  # fmt: skip
        assert all(isinstance(e, FlightFailedError) for e in outcomes["b"])
    else:
        assert sorted(r.joined for r in outcomes["a"]) == [False, True, True]
        assert all(r.joined for r in outcomes["b"])
        assert {r.token for r in outcomes["a"] + outcomes["b"]} == {outcomes["a"][0].token}
    failures = 1 if fail else 0
    sa, sb = a.stats(), b.stats()
    assert (sa.calls, sa.flights, sa.joins, sa.failures, sa.interrupted, sa.in_flight) == (
        3, 1, 2, failures, 0, 0,
    )  # fmt: skip
    assert (sb.calls, sb.flights, sb.joins, sb.failures, sb.interrupted, sb.in_flight) == (
        4, 0, 4, failures, 0, 0,
    )  # fmt: skip
    assert sa.coalescing_ratio == pytest.approx(1 / 3)
    assert sb.coalescing_ratio == 0.0
    # Joiners per flight: each group's callers that joined its local flight (in the
    # joining group, all but its first call, which asked the scope).
    assert (sa.joiners_max, sb.joiners_max) == (2, 3)
    assert sa.kept == sb.kept == 0


@pytest.mark.timeout(60)
def test_a_flight_joined_elsewhere_is_never_counted_as_a_flight(pair: tuple[str, Any]) -> None:
    """A flight joined in another group is never counted as a flight."""
    _scope, make = pair
    a, b = make(), make()
    _outcomes, (_a_during, b_during) = herd(a, b, n=1, m=2)
    assert (b_during.flights, b_during.joins) == (0, 2)


@pytest.mark.timeout(30)
def test_a_decorated_async_join_span_carries_the_token_and_the_link(spans: Any) -> None:
    """A decorated async def's join span carries the token and the link.

    The traced decorator path ends every span with its Result: a decorated ``async def``'s joins
    carry the token and the link to the flight's span."""
    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)
    started, gate = asyncio.Event(), asyncio.Event()
    tokens: list[int] = []

    @group.coalesce(key=lambda n: f"{MARK}:{n}")
    async def double(n: int) -> int:
        tokens.append(flightgroup.current_lease().token)
        started.set()
        await gate.wait()
        return 2 * n

    async def main() -> list[int]:
        leader = asyncio.ensure_future(double(4))
        await started.wait()
        joiners = [asyncio.ensure_future(double(4)) for _ in range(3)]
        await until(lambda: group.stats().joins == 3, "three joins")
        gate.set()
        return list(await asyncio.gather(leader, *joiners))

    assert asyncio.run(main()) == [8] * 4
    [flight] = named(exporter, "flightgroup.flight")
    joins = named(exporter, "flightgroup.join")
    assert len(joins) == 3 and len(tokens) == 1
    assert flight.attributes is not None
    assert flight.attributes["flightgroup.token"] == tokens[0]
    for join in joins:
        assert join.attributes is not None
        assert join.attributes["flightgroup.joined"] is True
        assert join.attributes["flightgroup.outcome"] == "value"
        assert join.attributes["flightgroup.token"] == tokens[0]
        assert [link.context.span_id for link in join.links] == [flight.context.span_id]


@pytest.mark.timeout(30)
def test_a_decorated_sync_join_span_carries_the_token_and_the_link(spans: Any) -> None:
    """A decorated sync def's join span carries the token and the link."""
    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)
    started, gate = threading.Event(), threading.Event()

    @group.coalesce(key=lambda n: f"{MARK}:{n}")
    def double(n: int) -> int:
        started.set()
        assert gate.wait(20)
        return 2 * n

    out: list[int] = []
    threads = [threading.Thread(target=lambda: out.append(double(4))) for _ in range(3)]
    threads[0].start()
    assert started.wait(20)
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: group.stats().joins == 2, "two joins")
    gate.set()
    for thread in threads:
        thread.join(20)
    assert out == [8] * 3
    [flight] = named(exporter, "flightgroup.flight")
    joins = named(exporter, "flightgroup.join")
    assert len(joins) == 2 and flight.attributes is not None
    for join in joins:
        assert join.attributes is not None
        assert join.attributes["flightgroup.token"] == flight.attributes["flightgroup.token"]
        assert [link.context.span_id for link in join.links] == [flight.context.span_id]


@pytest.mark.timeout(60)
def test_directory_spans_carry_the_scope_and_the_token_of_a_flight_led_elsewhere(
    h: Harness, spans: Any
) -> None:
    """Directory spans carry the scope, and the token of a flight led elsewhere."""
    provider, exporter = spans
    a = h.spawn_warm("a")
    group = FlightGroup(directory=h.dir, codec=JSON)
    instrument(group, provider)
    try:
        a.call("l", KEY, h.work(block=True, **{"return": VALUE}))
        token = a.expect("started", "l")["token"]
        joined = threading.Event()
        out: list[Any] = []

        def join() -> None:
            out.append(group.run_sync(KEY, lambda: "never", on_join=joined.set))

        thread = threading.Thread(target=join)
        thread.start()
        try:
            assert joined.wait(20)
        finally:
            a.release("l")
            thread.join(20)
        assert out and out[0].joined and out[0].token == token and out[0].value == VALUE
        led = group.run_sync("led-here", lambda: 1)
    finally:
        group.close()
    [join_span] = named(exporter, "flightgroup.join")
    [flight_span] = named(exporter, "flightgroup.flight")
    assert join_span.attributes is not None and flight_span.attributes is not None
    assert dict(join_span.attributes) == {
        "flightgroup.scope": "directory",
        "flightgroup.key_digest": key_digest(KEY),
        "flightgroup.joined": True,
        "flightgroup.token": token,
        "flightgroup.outcome": "value",
    }
    assert join_span.links == ()  # led in another process: the token ties them
    assert flight_span.attributes["flightgroup.scope"] == "directory"
    assert flight_span.attributes["flightgroup.joined"] is False
    assert flight_span.attributes["flightgroup.token"] == led.token
    assert led.token >> 32 == h.epoch()  # a directory token carries the epoch


@pytest.mark.timeout(60)
def test_a_directory_joiner_in_another_group_carries_the_leaders_token(
    directory: str, spans: Any
) -> None:
    """A directory joiner in another group carries the leader's token in its span."""
    provider, exporter = spans
    a = FlightGroup(directory=directory, codec=JSON)
    b = FlightGroup(directory=directory, codec=JSON)
    instrument(a, provider)
    instrument(b, provider)
    try:
        outcomes, _ = herd(a, b, n=1, m=1)
    finally:
        a.close()
        b.close()
    [flight] = named(exporter, "flightgroup.flight")
    [join] = named(exporter, "flightgroup.join")
    assert flight.attributes is not None and join.attributes is not None
    assert flight.attributes["flightgroup.scope"] == join.attributes["flightgroup.scope"] == (
        "directory"
    )
    assert join.attributes["flightgroup.token"] == flight.attributes["flightgroup.token"]
    assert join.attributes["flightgroup.token"] == outcomes["b"][0].token


@pytest.mark.timeout(60)
def test_prometheus_counts_a_directory_flight_across_groups(directory: str) -> None:
    """Prometheus counts a directory flight across groups, each group its own part."""
    registry = CollectorRegistry()
    a = FlightGroup(directory=directory, codec=JSON)
    b = FlightGroup(directory=directory, codec=JSON)
    register(a, registry, name="a")
    register(b, registry, name="b")
    try:
        outcomes, _ = herd(a, b, n=3, m=4)
    finally:
        a.close()
        b.close()
    assert all(r.value == VALUE for r in outcomes["a"] + outcomes["b"])
    expected = {
        "a": {"calls": 3, "flights": 1, "joins": 2},
        "b": {"calls": 4, "flights": 0, "joins": 4},
    }
    for name, counts in expected.items():
        for counter, value in counts.items():
            assert sample(registry, f"flightgroup_{counter}_total", name) == value, (name, counter)
        for counter in ("failures", "interrupted", "lease_losses"):
            assert sample(registry, f"flightgroup_{counter}_total", name) == 0.0
        assert sample(registry, "flightgroup_in_flight", name) == 0.0
        assert sample(registry, "flightgroup_joiners_per_flight_count", name) == 1.0
        assert sample(registry, "flightgroup_flight_seconds_count", name) == 1.0
    assert sample(registry, "flightgroup_joiners_per_flight_sum", "a") == 2.0
    assert sample(registry, "flightgroup_joiners_per_flight_sum", "b") == 3.0
    assert sample(registry, "flightgroup_wait_seconds_count", "a") == 2.0
    assert sample(registry, "flightgroup_wait_seconds_count", "b") == 3.0


@pytest.mark.timeout(60)
def test_prometheus_counts_a_lost_directory_lease(
    h: Harness, held_campaign: threading.Event
) -> None:
    """Prometheus counts a lost directory lease in lease_losses."""
    registry = CollectorRegistry()
    group = FlightGroup(directory=h.dir, codec=JSON, reconnect_timeout=1)
    register(group, registry, name="d")
    refused: list[BaseException] = []
    try:
        error = lose_a_directory_lease(h, group, held_campaign, refused)
    finally:
        group.close()
    assert isinstance(error, LeaseLostError)
    assert sample(registry, "flightgroup_lease_losses_total", "d") == 1.0
    assert sample(registry, "flightgroup_interrupted_total", "d") == 1.0
    assert sample(registry, "flightgroup_failures_total", "d") == 0.0
    # the lost one, the call after, and the tries refused before the group was served
    assert sample(registry, "flightgroup_calls_total", "d") == 2.0 + len(refused)
    assert sample(registry, "flightgroup_flights_total", "d") == 2.0
    assert sample(registry, "flightgroup_in_flight", "d") == 0.0


@pytest.mark.timeout(60)
def test_a_call_the_scope_could_not_serve_is_no_join() -> None:
    """A call the scope could not serve counts as a call, never as a join.

    Nothing listens where the group's Redis should be: the call raises, and it counts
    as a call, not as a join (nor a flight)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    group = FlightGroup(redis=f"redis://127.0.0.1:{port}/0", namespace="n", codec=JSON,
                        lease=1.0)
    try:
        with pytest.raises(flightgroup.UnavailableError):
            group.run_sync("k", lambda: 1)
        stats = group.stats()
        assert (stats.calls, stats.flights, stats.joins) == (1, 0, 0)
    finally:
        group.close()
