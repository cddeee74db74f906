"""The directory scope when processes die or freeze: leaders, joiners and coordinators
killed (SIGKILL) or frozen (SIGSTOP/SIGCONT), leases lost, epochs and tokens.

Who wins an election is steered, where it matters, by freezing the processes that must
not win before the coordinator is killed (a stopped process cannot take the lock), and
checked with the socket's SO_PEERCRED. Nothing waits on a bare sleep or asserts a
duration.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from ..dirproc import (
    HELLO,
    Child,
    Harness,
    assert_error,
    assert_value,
    herd_takes_over_a_killed_leader,
    key_file,
    key_lock_held,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)

V2 = b'{"protocol":"flightgroup","version":2}\n'


def test_leader_killed_joiners_interrupted_next_call_leads(h: Harness) -> None:
    a = h.spawn_warm("a")  # the coordinator
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    b.call("l", "k", h.work(block=True, **{"return": "never"}))
    started = b.expect("started", "l")
    c.call("j", "k", h.work())
    c.expect("joined", "j")
    a.call("j", "k", h.work(), mode="async")
    a.expect("joined", "j")

    b.kill()
    for child in (c, a):
        attrs = assert_error(child.expect("done", "j"), "FlightInterruptedError")
        assert attrs["key"] == "k"
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]  # no joiner ran it

    c.call("n", "k", h.work(**{"return": "again"}))
    done = c.expect("done", "n")
    assert_value(done, "again", joined=False)
    assert done["token"] > started["token"]
    assert [entry[0] for entry in h.runs_of("k")] == [b.pid, c.pid]


def test_leader_killed_a_fresh_caller_leads_the_next_flight(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    d = h.spawn_warm("d")
    b.call("l", "k", h.work(block=True))
    started = b.expect("started", "l")
    c.call("j", "k", h.work())
    c.expect("joined", "j")
    d.call("f", "k", h.work(**{"return": "fresh"}), fresh=True, mode="async")
    d.roundtrip("probe")  # the fresh request reached the coordinator first
    assert not d.seen("started", "f")

    b.kill()
    assert_error(c.expect("done", "j"), "FlightInterruptedError")
    # The fresh caller never joined the dead flight: it leads the next one.
    done = d.expect("done", "f")
    assert_value(done, "fresh", joined=False)
    assert done["token"] > started["token"]
    assert [entry[0] for entry in h.runs_of("k")] == [b.pid, d.pid]
    assert a.alive()


def test_coordinator_killed_while_another_process_leads(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    assert h.coordinator_pid() == a.pid
    b.call("l", "k", h.work(block=True, **{"return": [1, 2, 3]}))
    started = b.expect("started", "l")
    c.call("j", "k", h.work(), mode="async")
    c.expect("joined", "j")

    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) in (b.pid, c.pid)
    b.release("l")

    assert_value(b.expect("done", "l"), [1, 2, 3], joined=False)
    done = c.expect("done", "j")
    assert_value(done, [1, 2, 3], joined=True)
    assert done["token"] == started["token"]
    assert c.count("joined", "j") == 1  # on_join never again after a rejoin
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]
    assert h.epoch() == 2


def test_coordinator_that_was_the_leader_killed(h: Harness) -> None:
    a = h.spawn_warm("a")  # coordinator and leader
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    a.call("l", "k", h.work(block=True, **{"return": "never"}))
    started = a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    c.call("j", "k", h.work(), mode="async")
    c.expect("joined", "j")

    a.kill()
    for child in (b, c):
        assert_error(child.expect("done", "j"), "FlightInterruptedError")
    assert h.runs_of("k") == [(a.pid, "k", started["token"])]  # nobody re-ran it

    # The next call leads, in the new term.
    b.call("n", "k", h.work(**{"return": "new"}))
    done = b.expect("done", "n")
    assert_value(done, "new", joined=False)
    assert done["token"] >> 32 == h.epoch() == 2
    assert [entry[0] for entry in h.runs_of("k")] == [a.pid, b.pid]


def _frozen_leader_and_dead_coordinator(
    h: Harness,
) -> tuple[dict[str, Any], Child, Child, Child]:
    """a coordinates, b leads "k" (blocked), d joins it; b is frozen and a killed.
    Returns (b's started event, b, c, d) once c or d serves."""
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    d = h.spawn_warm("d")
    b.call("l", "k", h.work(block=True, **{"return": "from b"}))
    started = b.expect("started", "l")
    d.call("j", "k", h.work())
    d.expect("joined", "j")

    b.stop()
    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) in (c.pid, d.pid)  # b is frozen
    assert key_lock_held(h, "k")  # the frozen leader keeps its key lock

    # A new call of the key waits: the coordinator knows no flight of it, and the key
    # lock is held. c's later request is answered while this one is not.
    c.call("w", "k", h.work(**{"return": "from c"}))
    c.roundtrip("probe")
    d.roundtrip("probe")
    assert not c.seen("done", "w")
    assert not c.seen("started", "w")
    assert not d.seen("done", "j")
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]
    return started, b, c, d


def test_frozen_leader_while_coordinator_killed_then_continued(h: Harness) -> None:
    started, b, c, d = _frozen_leader_and_dead_coordinator(h)

    b.cont()  # b reasserts its flight: the waiting call joins it
    c.expect("joined", "w")
    b.release("l")

    assert_value(b.expect("done", "l"), "from b", joined=False)
    for child, call_id in ((c, "w"), (d, "j")):
        done = child.expect("done", call_id)
        assert_value(done, "from b", joined=True)
        assert done["token"] == started["token"]
        assert child.count("joined", call_id) == 1
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]
    # Nothing keeps the key lock after the flight: the next call of the key leads.
    for child in (b, c, d):
        child.roundtrip("after")  # after every landing and answer of this flight
    d.call("n", "k", h.work(**{"return": "next"}))
    done = d.expect("done", "n")
    assert_value(done, "next", joined=False)
    assert [entry[0] for entry in h.runs_of("k")] == [b.pid, d.pid]


def test_frozen_leader_then_killed_the_waiting_call_leads(h: Harness) -> None:
    started, b, c, d = _frozen_leader_and_dead_coordinator(h)

    b.kill()  # the key lock frees before any reassert
    done = c.expect("done", "w")
    assert_value(done, "from c", joined=False)
    assert done["token"] > started["token"]
    assert done["token"] >> 32 == h.epoch() == 2
    # The rejoin of the dead leader's flight is interrupted; it never runs the work.
    assert_error(d.expect("done", "j"), "FlightInterruptedError")
    assert [entry[0] for entry in h.runs_of("k")] == [b.pid, c.pid]
    # Nothing keeps the key lock after the flight: the next call of the key leads.
    c.roundtrip("after")
    d.call("n", "k", h.work(**{"return": "next"}))
    assert_value(d.expect("done", "n"), "next", joined=False)
    assert [entry[0] for entry in h.runs_of("k")] == [b.pid, c.pid, d.pid]


def test_a_joiner_that_rejoins_late_gets_the_landing_of_the_new_term(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    b.call("l", "k", h.work(block=True, **{"return": "late but here"}))
    started = b.expect("started", "l")
    c.call("j", "k", h.work(), mode="async")
    c.expect("joined", "j")

    c.stop()  # c will rejoin only after the flight landed in the new term
    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) == b.pid
    b.release("l")
    assert_value(b.expect("done", "l"), "late but here", joined=False)
    b.roundtrip("after")  # the landing reached the new coordinator
    c.cont()

    done = c.expect("done", "j")
    assert_value(done, "late but here", joined=True)
    assert done["token"] == started["token"]
    assert c.count("joined", "j") == 1
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]


@pytest.mark.parametrize("how", ["coordinator-frozen-then-killed", "coordinator-killed"])
def test_landing_made_while_no_coordinator_serves(h: Harness, how: str) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    b.call("l", "k", h.work(block=True, **{"return": {"landed": True}}))
    started = b.expect("started", "l")
    c.call("j", "k", h.work(), mode="async")
    c.expect("joined", "j")

    if how == "coordinator-frozen-then-killed":
        # The coordinator cannot answer the landing; then it dies without acknowledging.
        a.stop()
        b.release("l")
        b.expect("returning", "l")
        a.kill()
    else:
        a.kill()
        b.release("l")  # lands while the election may still be going on

    done = c.expect("done", "j")
    assert_value(done, {"landed": True}, joined=True)
    assert done["token"] == started["token"]
    assert_value(b.expect("done", "l"), {"landed": True}, joined=False)
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]
    # The group goes on in the new term.
    c.call("n", "k", h.work(**{"return": 2}))
    done = c.expect("done", "n")
    assert_value(done, 2, joined=False)
    assert done["token"] >> 32 == 2


@pytest.mark.timeout(90)
def test_two_failovers_in_a_row(h: Harness) -> None:
    a = h.spawn_warm("a")
    s1 = h.spawn_warm("s1")
    s2 = h.spawn_warm("s2")
    leader = h.spawn_warm("leader")
    j = h.spawn_warm("j")
    assert h.coordinator_pid() == a.pid
    leader.call("l", "k", h.work(block=True, **{"return": "survived"}))
    started = leader.expect("started", "l")
    j.call("j", "k", h.work(), mode="async")
    j.expect("joined", "j")

    # Failover 1: only s1 can win.
    frozen = (s2, leader, j)
    for child in frozen:
        child.stop()
    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) == s1.pid
    for child in frozen:
        child.cont()
    for child in (leader, j, s2):
        child.roundtrip("after-1")  # every process reached the new coordinator
    assert h.epoch() == 2

    # Failover 2: only s2 can win.
    frozen = (leader, j)
    for child in frozen:
        child.stop()
    s1.kill()
    assert h.coordinator_pid(not_pid=s1.pid) == s2.pid
    for child in frozen:
        child.cont()
    assert h.epoch() == 3

    leader.release("l")
    assert_value(leader.expect("done", "l"), "survived", joined=False)
    done = j.expect("done", "j")
    assert_value(done, "survived", joined=True)
    assert done["token"] == started["token"]
    assert j.count("joined", "j") == 1
    assert h.runs_of("k") == [(leader.pid, "k", started["token"])]

    j.call("n", "k", h.work(**{"return": "third term"}))
    done = j.expect("done", "n")
    assert_value(done, "third term", joined=False)
    assert done["token"] >> 32 == 3


@pytest.mark.timeout(90)
def test_2mib_value_to_a_frozen_joiner_while_the_coordinator_dies(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    e = h.spawn_warm("e")
    big = "x" * (2 * 1024 * 1024)  # what return_chars makes
    b.call("l", "k", h.work(block=True, return_chars=len(big)), mode="async")
    started = b.expect("started", "l")
    c.call("j", "k", h.work())
    c.expect("joined", "j")
    e.call("j", "k", h.work())
    e.expect("joined", "j")

    c.stop()  # c cannot read the value the coordinator pushes to it
    b.release("l")
    # e has the value: the coordinator took the landing and pushed it to both joiners;
    # c's copy cannot have reached c, which reads nothing.
    assert_value(e.expect("done", "j"), big, joined=True)
    a.kill()  # the coordinator dies with c's copy undelivered
    assert h.coordinator_pid(not_pid=a.pid) in (b.pid, e.pid)  # c is frozen
    c.cont()

    # The leader is alive and landed: c still gets the value (docs/api.md: a joiner is
    # interrupted only when the leader died or lost its lease).
    done = c.expect("done", "j")
    assert_value(done, big, joined=True)
    assert done["token"] == started["token"]
    assert_value(b.expect("done", "l"), big, joined=False)
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]


def test_a_frozen_joiner_reads_the_landing_its_socket_holds_when_a_write_fails_first(
    h: Harness,
) -> None:
    """A joiner whose landing is in its socket when the coordinator dies gets the value,
    even when one of its threads writes to the dead connection first."""
    a = h.spawn_warm("a")  # the coordinator
    b = h.spawn_warm("b")
    # c's group thread stops at its join's log record: from then on it reads nothing
    # until the test lets it go on, while c's other threads run.
    c = h.spawn_warm("c", block_log="join, token")
    e = h.spawn_warm("e")
    b.call("l", "k", h.work(block=True, **{"return": "v"}))
    started = b.expect("started", "l")
    c.call("j", "k", h.work())
    c.expect("log_blocked")
    e.call("j", "k", h.work())
    e.expect("joined", "j")

    b.release("l")
    # e has the value: the coordinator wrote it to both joiners (c first, it joined
    # first) and acknowledged the landing.
    assert_value(e.expect("done", "j"), "v", joined=True)
    assert_value(b.expect("done", "l"), "v", joined=False)
    c.stop()  # c cannot take the election
    a.kill()  # the coordinator dies; its copy for c is only in c's socket
    assert h.coordinator_pid(not_pid=a.pid) in (b.pid, e.pid)
    c.cont()

    # A thread of c writes to the dead connection before c's group thread reads it:
    # a call of another key (its key's file is made once its request went out).
    c.call("w", "k2", h.work(**{"return": "w"}))
    wait_for(
        lambda: os.path.exists(h.path("execution-locks", key_file("k2"))),
        "c's request of k2 to be written",
    )
    c.send(cmd="unblock_log")

    done = c.expect("done", "j")
    assert_value(done, "v", joined=True)
    assert done["token"] == started["token"]
    assert_value(c.expect("done", "w"), "w", joined=False)
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]


def test_a_leader_whose_landing_no_coordinator_takes_raises_lease_lost(h: Harness) -> None:
    """A leader that lands while no coordinator can take it raises LeaseLostError (its
    local joiner is interrupted with it), as every joiner elsewhere is: one outcome."""
    a = h.spawn_warm("a")  # the coordinator
    b = h.spawn_warm("b", reconnect_timeout=1)
    c = h.spawn_warm("c")
    d = h.spawn_warm("d")
    b.call("l", "k", h.work(block=True, **{"return": "v"}))
    started = b.expect("started", "l")
    b.call("lj", "k", h.work())  # a joiner in the leader's own process
    b.expect("joined", "lj")
    for child in (c, d):
        child.call("j", "k", h.work())
        child.expect("joined", "j")

    b.stop()
    a.kill()
    next_pid = h.coordinator_pid(not_pid=a.pid)  # b is frozen: c or d
    frozen, other = (c, d) if next_pid == c.pid else (d, c)
    assert next_pid == frozen.pid
    frozen.stop()  # the next coordinator takes no landing
    b.cont()
    b.release("l")
    b.expect("returning", "l")

    # Its landing could only be queued: the leader does not return the value.
    done = b.expect("done", "l")
    attrs = assert_error(done, "LeaseLostError")
    assert attrs["key"] == "k"
    assert done["cause"] is None
    assert_error(b.expect("done", "lj"), "FlightInterruptedError")
    frozen.cont()
    for child in (c, d):
        assert_error(child.expect("done", "j"), "FlightInterruptedError")
    assert other.alive()
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]
    b.served_again("after")  # once a coordinator answers


def test_a_call_on_its_way_to_a_dying_coordinator_goes_to_the_next(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    a.stop()  # the coordinator cannot answer b's request ...
    b.call("n", "k", h.work(**{"return": "led"}))
    a.kill()  # ... and dies: b asks the next coordinator, as a new call
    done = b.expect("done", "n")
    assert_value(done, "led", joined=False)
    assert done["token"] >> 32 == 2
    assert h.runs_of("k") == [(b.pid, "k", done["token"])]


def test_tokens_carry_the_epoch(h: Harness) -> None:
    a = h.spawn("a")
    first = a.roundtrip("1")
    assert h.epoch() == 1
    assert first["token"] >> 32 == 1
    second = a.roundtrip("2")
    assert second["token"] > first["token"]
    b = h.spawn_warm("b")
    third = b.roundtrip("3")
    assert third["token"] >> 32 == 1
    assert third["token"] > second["token"]

    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) == b.pid
    fourth = b.roundtrip("4")
    assert h.epoch() == 2
    assert fourth["token"] >> 32 == 2
    assert fourth["token"] > third["token"]
    assert fourth["token"] < 2**63
    # docs/directory-protocol.md: a second durable copy of the epoch.
    with open(h.path("state", "epoch")) as f:
        assert int(f.read()) == 2
    # The lease's token is the flight's token (Result.token of the leader).
    b.call("5", "k", h.work(**{"return": 5}))
    started = b.expect("started", "5")
    assert b.expect("done", "5")["token"] == started["token"]
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]


@pytest.mark.parametrize("damage", ["corrupt", "empty", "missing", "both-missing"])
def test_a_damaged_epoch_file_never_lowers_the_epoch(h: Harness, damage: str) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    before = b.roundtrip("1")["token"]
    assert h.epoch() == 1
    b.stop()  # b must not win before the damage is done
    a.kill()
    if damage == "corrupt":
        with open(h.path("flight.epoch"), "w") as f:
            f.write("not a number")
    elif damage == "empty":
        open(h.path("flight.epoch"), "w").close()
    else:
        os.unlink(h.path("flight.epoch"))
        if damage == "both-missing":  # the key-lock files' tokens are the evidence left
            os.unlink(h.path("state", "epoch"))
    b.cont()
    after = b.roundtrip("2")["token"]
    assert after > before
    assert after >> 32 == h.epoch() == 2


# -- leases -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("then", "mode"),
    [("return", "sync"), ("raise", "async"), ("raise_lease", "sync"), ("raise_lease", "async")],
)
def test_lease_lost_when_no_coordinator_can_be_reached(h: Harness, then: str, mode: str) -> None:
    a = h.spawn_warm("a")
    leader = h.spawn_warm("leader", reconnect_timeout=1)
    j = h.spawn_warm("j", reconnect_timeout=30)
    spec = {
        "return": {"wait_lost": True, "return": "stale"},
        "raise": {"wait_lost": True, "raise": "after loss"},
        "raise_lease": {"wait_lost": True, "raise_lease": True},
    }[then]
    leader.call("l", "k", h.work(**spec), mode=mode)
    started = leader.expect("started", "l")
    j.call("j", "k", h.work())
    j.expect("joined", "j")

    # No coordinator will serve: the test takes the election itself and serves nothing.
    leader.stop()
    j.stop()
    a.kill()
    fd = h.take_election()
    leader.cont()
    j.cont()

    assert leader.expect("lost", "l")["lost"] is True
    done = leader.expect("done", "l")
    attrs = assert_error(done, "LeaseLostError")
    assert attrs["key"] == "k"
    if then == "raise":
        assert done["cause"] == {"type": "ValueError", "message": "after loss"}
    elif then == "raise_lease":
        assert done["same_as_work_error"] is True
    else:
        assert done["cause"] is None

    h.give_back_election(fd)  # a coordinator can be elected again
    assert_error(j.expect("done", "j"), "FlightInterruptedError")
    assert h.runs_of("k") == [(leader.pid, "k", started["token"])]
    j.call("n", "k", h.work(**{"return": "next"}))
    done = j.expect("done", "n")
    assert_value(done, "next", joined=False)
    assert done["token"] >> 32 == 2
    leader.served_again("after")  # the process that lost a lease is served again


def test_leader_loses_its_lease_while_another_version_holds_the_election(h: Harness) -> None:
    a = h.spawn_warm("a")
    leader = h.spawn_warm("leader", reconnect_timeout=1)
    leader.call("l", "k", h.work(wait_lost=True, **{"return": "stale"}), mode="async")
    leader.expect("started", "l")

    leader.stop()
    a.kill()
    h.take_election()
    fake = h.fake_coordinator(V2)
    leader.cont()

    assert leader.expect("lost", "l")["lost"] is True
    assert_error(leader.expect("done", "l"), "LeaseLostError")
    assert fake.hellos.get(timeout=20) == HELLO
    leader.call("n", "k2", h.work(**{"return": 1}))
    attrs = assert_error(leader.expect("done", "n"), "ProtocolVersionError")
    assert (attrs["ours"], attrs["theirs"]) == (1, 2)
    assert h.runs_of("k2") == []


def test_a_herd_takes_over_the_flight_of_a_killed_leader(h: Harness) -> None:
    """takeover=1: the leader's process (not the coordinator's) is SIGKILLed mid-work in a
    herd of 4 processes x 75 callers: no caller of the other three fails and the work ran
    exactly twice."""
    coordinator = h.spawn_warm("a", takeover=1)
    others = [h.spawn_warm(name, takeover=1) for name in "bcd"]
    herd_takes_over_a_killed_leader(h, [others[0], coordinator, *others[1:]], callers=75)


def test_joiner_killed_the_flight_goes_on(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    a.call("l", "k", h.work(block=True, **{"return": "v"}))
    started = a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    c.call("j", "k", h.work())
    c.expect("joined", "j")
    b.kill()
    a.release("l")
    assert_value(a.expect("done", "l"), "v", joined=False)
    done = c.expect("done", "j")
    assert_value(done, "v", joined=True)
    assert done["token"] == started["token"]
    assert h.runs_of("k") == [(a.pid, "k", started["token"])]
    assert os.path.exists(h.path("flight.sock"))
