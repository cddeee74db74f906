"""The directory scope with real processes: sharing one run, the files on disk, codecs,
large values, closing.

Every child is a ``tests.dirproc`` process driven over pipes; interleavings are forced
with blocking works (released by a command), on_join events and SIGSTOP/SIGCONT.
Nothing here waits on a bare sleep or asserts a duration.
"""

from __future__ import annotations

import os
import stat

import pytest

from ..dirproc import (
    HELLO_OK,
    Harness,
    RawConn,
    assert_error,
    assert_value,
    key_file,
    key_lock_held,
    wait_any,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("leader_is", ["coordinator", "client"])
def test_three_processes_share_one_run(h: Harness, mode: str, leader_is: str) -> None:
    a = h.spawn_warm("a")  # the first to call: the coordinator
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    assert h.coordinator_pid() == a.pid
    leader, joiners = (a, [b, c]) if leader_is == "coordinator" else (b, [a, c])

    leader.call("l", "k", h.work(block=True, **{"return": {"n": [1, 2]}}), mode=mode)
    started = leader.expect("started", "l")
    for j in joiners:
        j.call("j", "k", h.work(**{"return": "not me"}), mode=mode)
        j.expect("joined", "j")
    leader.release("l")

    lead = leader.expect("done", "l")
    assert_value(lead, {"n": [1, 2]}, joined=False)
    assert lead["token"] == started["token"]
    for j in joiners:
        done = j.expect("done", "j")
        assert_value(done, {"n": [1, 2]}, joined=True)
        assert done["token"] == started["token"]
        assert j.count("joined", "j") == 1
    assert leader.count("joined", "l") == 0
    assert h.runs_of("k") == [(leader.pid, "k", started["token"])]


def test_groups_and_threads_in_one_process_share_one_run(h: Harness) -> None:
    a = h.spawn_warm("a")  # coordinator, group g0
    b = h.spawn_warm("b")
    a.send(cmd="open", group="g1")
    a.expect("opened")
    a.send(cmd="open", group="g2", thread=True)  # made in a thread of its own
    a.expect("opened")

    a.call("l", "k", h.work(block=True, **{"return": 42}), group="g1")
    started = a.expect("started", "l")
    a.call("j0", "k", h.work(), group="g0", mode="async")
    a.expect("joined", "j0")
    a.call("j2", "k", h.work(), group="g2")  # a sync call: a thread of its own
    a.expect("joined", "j2")
    b.call("jb", "k", h.work())
    b.expect("joined", "jb")
    a.release("l")

    assert_value(a.expect("done", "l"), 42, joined=False)
    for child, call_id in ((a, "j0"), (a, "j2"), (b, "jb")):
        done = child.expect("done", call_id)
        assert_value(done, 42, joined=True)
        assert done["token"] == started["token"]
    assert h.runs_of("k") == [(a.pid, "k", started["token"])]


def test_a_group_in_another_thread_leads_for_the_others(h: Harness) -> None:
    a = h.spawn_warm("a")
    a.send(cmd="open", group="t", thread=True)
    a.expect("opened")
    a.call("l", "k", h.work(block=True, **{"return": "v"}), group="t", mode="async")
    started = a.expect("started", "l")
    a.call("j", "k", h.work(), group="g0")
    a.expect("joined", "j")
    a.release("l")
    assert_value(a.expect("done", "l"), "v", joined=False)
    assert_value(a.expect("done", "j"), "v", joined=True)
    assert h.runs_of("k") == [(a.pid, "k", started["token"])]


def test_local_callers_make_one_request_per_key(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    a.call("l", "k", h.work(block=True, **{"return": "herd"}))
    started = a.expect("started", "l")
    ids = [f"j{i}" for i in range(6)]
    for i, call_id in enumerate(ids):
        b.call(call_id, "k", h.work(), mode="async" if i % 2 else "sync")
    for call_id in ids:
        b.expect("joined", call_id)
    with RawConn(h.path("flight.sock")) as conn:
        assert conn.hello() == HELLO_OK
        conn.send_frame({"op": "status", "id": 1})
        flights = [f for f in conn.read_frame()[0]["flights"] if f["key"] == "k"]
    # Six callers in b, one request to the coordinator (DESIGN.md: two levels).
    assert [(f["leader_pid"], f["joiners"], f["token"]) for f in flights] == [
        (a.pid, 1, started["token"])
    ]
    a.release("l")
    assert_value(a.expect("done", "l"), "herd", joined=False)
    for call_id in ids:
        done = b.expect("done", call_id)
        assert_value(done, "herd", joined=True)
        assert done["token"] == started["token"]
    assert len(h.runs_of("k")) == 1


def test_many_keys_three_processes_one_run_each(h: Harness) -> None:
    children = [h.spawn_warm(name) for name in ("a", "b", "c")]
    keys = [f"key-{i}" for i in range(20)]
    for i, key in enumerate(keys):
        # Each process calls every key; who asks first varies with the key.
        order = children[i % 3 :] + children[: i % 3]
        for child in order:
            mode = "async" if (i + ord(child.name)) % 2 else "sync"
            child.call(key, key, h.work(block=True, **{"return": key.upper()}), mode=mode)
    # Every call either started its work or joined; nothing ends while all are blocked.
    for key in keys:
        wait_for(
            lambda key=key: (
                sum(c.seen("started", key) or c.seen("joined", key) for c in children) == 3
            ),
            f"every call of {key} to lead or join",
        )
    for child in children:
        child.send(cmd="release_all")
    for key in keys:
        dones = [child.expect("done", key) for child in children]
        for done in dones:
            assert done["ok"] and done["value"] == key.upper(), done
        assert sorted(done["joined"] for done in dones) == [False, True, True], dones
        assert len({done["token"] for done in dones}) == 1, dones
        runs = h.runs_of(key)
        assert len(runs) == 1, runs
        assert runs[0][2] == dones[0]["token"]


def test_a_joiner_that_closes_its_group_withdraws_only_itself(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    a.call("l", "k", h.work(block=True, **{"return": "v"}))
    started = a.expect("started", "l")
    b.call("j", "k", h.work(), mode="async")
    b.expect("joined", "j")
    c.call("j", "k", h.work())
    c.expect("joined", "j")
    b.send(cmd="close", group="g0")
    assert b.expect("closed")["error"] is None
    assert_error(b.expect("done", "j"), "GroupClosedError")
    a.release("l")
    assert_value(a.expect("done", "l"), "v", joined=False)
    done = c.expect("done", "j")
    assert_value(done, "v", joined=True)
    assert done["token"] == started["token"]
    assert len(h.runs_of("k")) == 1


def test_a_long_unicode_key_is_shared(h: Harness) -> None:
    key = "tenant:é/" + "ключ" * 2000 + "\n\x00end"
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    b.call("l", key, h.work(block=True, **{"return": 1}))
    b.expect("started", "l")
    a.call("j", key, h.work())
    a.expect("joined", "j")
    b.release("l")
    assert_value(b.expect("done", "l"), 1, joined=False)
    assert_value(a.expect("done", "j"), 1, joined=True)
    assert os.path.isfile(h.path("execution-locks", key_file(key)))


@pytest.mark.parametrize("who", ["leader", "joiner"])
def test_a_callers_own_timeout_withdraws_only_that_caller(h: Harness, who: str) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    # The leader's timeout: its sync work runs on a thread of its own and goes on.
    b.call(
        "l", "k", h.work(block=True, **{"return": "v"}), timeout=0.3 if who == "leader" else None
    )
    started = b.expect("started", "l")
    c.call("j", "k", h.work(), timeout=0.3 if who == "joiner" else None, mode="async")
    c.expect("joined", "j")
    a.call("j", "k", h.work())
    a.expect("joined", "j")
    quitter, call_id = (b, "l") if who == "leader" else (c, "j")
    assert_error(quitter.expect("done", call_id), "TimeoutError")
    a.roundtrip("probe")
    assert not a.seen("done", "j")  # the flight goes on for the others
    b.release("l")
    done = a.expect("done", "j")
    assert_value(done, "v", joined=True)
    assert done["token"] == started["token"]
    if who == "joiner":
        assert_value(b.expect("done", "l"), "v", joined=False)
    assert len(h.runs_of("k")) == 1


def test_a_flight_after_a_flight_is_a_new_flight(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    a.call("1", "k", h.work(**{"return": 1}))
    first = a.expect("done", "1")
    assert_value(first, 1, joined=False)
    # The leader's call may return before its landing reached the coordinator (a call
    # then still joins the flight); a later request of a on the same connection orders it.
    a.roundtrip("probe")
    b.call("2", "k", h.work(**{"return": 2}))
    second = b.expect("done", "2")
    assert_value(second, 2, joined=False)
    assert second["token"] > first["token"]
    assert [entry[0] for entry in h.runs_of("k")] == [a.pid, b.pid]


def test_directory_created_0700_at_first_call_socket_0600(h: Harness) -> None:
    h.dir = os.path.join(h.root, "p", "q", "d")  # parents missing too
    a = h.spawn("a")
    # Construction creates nothing.
    assert not os.path.exists(os.path.join(h.root, "p"))
    a.call("1", "some key/é", h.work(**{"return": 1}))
    started = a.expect("started", "1")
    assert_value(a.expect("done", "1"), 1, joined=False)

    st = os.stat(h.dir)
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o700
    sock = os.stat(h.path("flight.sock"))
    assert stat.S_ISSOCK(sock.st_mode)
    assert stat.S_IMODE(sock.st_mode) == 0o600
    assert os.path.exists(h.path("flight.lock"))
    assert h.epoch() == 1
    lock_file = h.path("execution-locks", key_file("some key/é"))
    assert os.path.isfile(lock_file)
    # docs/directory-protocol.md: the leader writes its token into the key-lock file.
    with open(lock_file) as f:
        assert int(f.read()) == started["token"]
    # Once the landing is acknowledged the key lock is free (nothing else will take it).
    wait_for(lambda: not key_lock_held(h, "some key/é"), "the key lock to be freed")


def test_an_existing_directory_keeps_its_mode(h: Harness) -> None:
    os.mkdir(h.dir)
    os.chmod(h.dir, 0o755)
    a = h.spawn("a")
    a.roundtrip("1")
    assert stat.S_IMODE(os.stat(h.dir).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(h.path("flight.sock")).st_mode) == 0o600


def test_key_lock_is_held_while_the_work_runs(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    b.call("l", "k", h.work(block=True, **{"return": 1}))
    b.expect("started", "l")
    assert key_lock_held(h, "k")
    b.release("l")
    assert_value(b.expect("done", "l"), 1, joined=False)
    b.roundtrip("2")  # after b's landing, on the same connection
    # The lock is freed once the landing is acknowledged; the next call leads.
    a.call("n", "k", h.work(**{"return": 2}))
    assert_value(a.expect("done", "n"), 2, joined=False)


def test_fresh_callers_in_other_processes_share_the_next_flight(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    a.call("l", "k", h.work(block=True, **{"return": "old"}))
    first = a.expect("started", "l")
    b.call("f", "k", h.work(block=True, **{"return": "new"}), fresh=True)
    c.call("f", "k", h.work(block=True, **{"return": "new"}), fresh=True, mode="async")
    b.roundtrip("probe")  # b's and c's fresh requests reached the coordinator before these
    c.roundtrip("probe")
    assert not b.seen("started", "f") and not c.seen("started", "f")
    assert not b.seen("done", "f") and not c.seen("done", "f")
    a.release("l")
    assert_value(a.expect("done", "l"), "old", joined=False)

    # One of them leads the next flight, the other joins it.
    leader = wait_any([b, c], "started", "f")
    joiner = c if leader is b else b
    started = leader.expect("started", "f")
    joiner.expect("joined", "f")
    leader.release("f")
    assert_value(leader.expect("done", "f"), "new", joined=False)
    done = joiner.expect("done", "f")
    assert_value(done, "new", joined=True)
    assert done["token"] == started["token"] > first["token"]
    runs = h.runs_of("k")
    assert [r[2] for r in runs] == [first["token"], started["token"]]


def test_a_kept_outcome_is_served_to_other_processes(h: Harness) -> None:
    a = h.spawn_warm("a", keep_success=60.0)
    b = h.spawn_warm("b")  # no retention of its own: the leader's policy is the flight's
    a.call("l", "k", h.work(**{"return": "kept"}))
    lead = a.expect("done", "l")
    assert_value(lead, "kept", joined=False)
    b.call("k1", "k", h.work(**{"return": "not kept"}))
    done = b.expect("done", "k1")
    assert_value(done, "kept", joined=True)
    assert done["token"] == lead["token"]
    assert not b.seen("joined", "k1")  # on_join is never called for a kept outcome
    assert len(h.runs_of("k")) == 1


def test_retries_belong_to_the_flight_each_attempt_has_its_token(h: Harness) -> None:
    a = h.spawn_warm("a")
    leader = h.spawn_warm("leader", retry_attempts=3)
    leader.call("l", "k", h.work(block=True, raise_times=2, **{"return": "third"}))
    first = leader.expect("started", "l")
    a.call("j", "k", h.work())
    a.expect("joined", "j")
    leader.release("l")  # the event stays set: every attempt runs through
    lead = leader.expect("done", "l")
    assert_value(lead, "third", joined=False)
    done = a.expect("done", "j")
    assert_value(done, "third", joined=True)
    runs = h.runs_of("k")
    tokens = [token for _, _, token in runs]
    assert [pid for pid, _, _ in runs] == [leader.pid] * 3
    assert tokens[0] == first["token"] and tokens == sorted(set(tokens))
    assert lead["token"] == done["token"] == tokens[-1]  # the attempt that produced it
    assert a.count("joined", "j") == 1


def test_deadline_of_the_leader_is_the_flights_deadline(h: Harness) -> None:
    a = h.spawn_warm("a")
    leader = h.spawn_warm("leader", deadline=0.5)
    leader.call("l", "k", h.work(block=True), mode="async")  # never released
    leader.expect("started", "l")
    a.call("j", "k", h.work())
    a.expect("joined", "j")
    attrs = assert_error(leader.expect("done", "l"), "FlightTimeoutError")
    assert attrs["deadline"] == 0.5
    attrs = assert_error(a.expect("done", "j"), "FlightTimeoutError")
    assert attrs["deadline"] == 0.5
    assert attrs["key"] == "k"
    assert len(h.runs_of("k")) == 1


# -- codecs and value sizes -------------------------------------------------------


def test_encode_error_fails_the_flight_for_all(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    b.call("l", "k", h.work(block=True, unencodable=True))
    b.expect("started", "l")
    a.call("j", "k", h.work())
    a.expect("joined", "j")
    c.call("j", "k", h.work(), mode="async")
    c.expect("joined", "j")
    b.release("l")

    lead = b.expect("done", "l")
    assert_error(lead, "TypeError")  # JSON cannot encode a set: the encode error itself
    for child in (a, c):
        attrs = assert_error(child.expect("done", "j"), "FlightFailedError")
        assert attrs["key"] == "k"
        assert attrs["error_type"] == "TypeError"
        assert attrs["message"] == lead["message"]
    # A failed flight leaves nothing behind: the next call leads.
    c.call("n", "k", h.work(**{"return": "fine"}))
    assert_value(c.expect("done", "n"), "fine", joined=False)
    assert [entry[0] for entry in h.runs_of("k")] == [b.pid, c.pid]


def test_work_error_leader_gets_it_joiners_get_flight_failed(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    a.call("l", "k", h.work(block=True, **{"raise": "no such user"}), mode="async")
    a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    a.release("l")
    lead = a.expect("done", "l")
    assert_error(lead, "ValueError")
    assert lead["message"] == "no such user"
    attrs = assert_error(b.expect("done", "j"), "FlightFailedError")
    assert attrs == {
        "key": "k",
        "error_type": "ValueError",
        "error_module": "builtins",
        "message": "no such user",
    }
    assert b.count("done", "j") == 1
    assert len(h.runs_of("k")) == 1


def test_decode_error_in_the_leaders_process_fails_only_the_leader(h: Harness) -> None:
    a = h.spawn_warm("a", codec="test")
    leader = h.spawn_warm("leader", codec="test", fail_decode=True)
    leader.call("l", "k", h.work(block=True, **{"return": "!dec me"}))
    leader.expect("started", "l")
    a.call("j", "k", h.work())
    a.expect("joined", "j")
    leader.release("l")
    assert_error(leader.expect("done", "l"), "DecodeFailure")
    assert_value(a.expect("done", "j"), "!dec me", joined=True)
    assert len(h.runs_of("k")) == 1


def test_decode_error_fails_only_that_caller(h: Harness) -> None:
    a = h.spawn_warm("a", codec="test")
    bad = h.spawn_warm("bad", codec="test", fail_decode=True)
    good = h.spawn_warm("good", codec="test")
    a.call("l", "k", h.work(block=True, **{"return": "!dec me"}))
    started = a.expect("started", "l")
    bad.call("j", "k", h.work())
    bad.expect("joined", "j")
    good.call("j", "k", h.work())
    good.expect("joined", "j")
    a.release("l")

    assert_value(a.expect("done", "l"), "!dec me", joined=False)
    done = good.expect("done", "j")
    assert_value(done, "!dec me", joined=True)
    assert done["token"] == started["token"]
    failed = bad.expect("done", "j")
    assert_error(failed, "DecodeFailure")
    assert "cannot decode" in failed["message"]
    assert len(h.runs_of("k")) == 1
    # The process whose decode failed is still served.
    bad.roundtrip("after")


def test_value_over_max_value_bytes(h: Harness) -> None:
    a = h.spawn_warm("a")
    leader = h.spawn_warm("leader", max_value_bytes=1000)
    leader.call("l", "k", h.work(block=True, return_chars=2000))
    leader.expect("started", "l")
    a.call("j", "k", h.work())
    a.expect("joined", "j")
    leader.release("l")

    attrs = assert_error(leader.expect("done", "l"), "ValueTooLargeError")
    assert attrs["key"] == "k"
    assert attrs["size"] == 2002  # the JSON text: 2,000 characters and two quotes
    assert attrs["limit"] == 1000
    joined = assert_error(a.expect("done", "j"), "FlightFailedError")
    assert joined["error_type"] == "ValueTooLargeError"
    # Nothing else changes: the group goes on, the key is not poisoned.
    leader.call("n", "k", h.work(return_chars=1000 - 2))  # exactly the limit
    assert_value(leader.expect("done", "n"), "x" * 998, joined=False)
    a.roundtrip("after")


@pytest.mark.timeout(90)
def test_2mib_value_to_a_frozen_joiner(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    e = h.spawn_warm("e")
    big = "x" * (2 * 1024 * 1024)
    b.call("l", "k", h.work(block=True, return_chars=len(big)))
    started = b.expect("started", "l")
    c.call("j", "k", h.work(), mode="async")  # the first joiner: the frozen one
    c.expect("joined", "j")
    e.call("j", "k", h.work())
    e.expect("joined", "j")

    c.stop()
    b.release("l")
    b.expect("returning", "l")
    # A joiner that does not read does not hold up the others or the coordinator.
    done = e.expect("done", "j")
    assert_value(done, big, joined=True)
    a.roundtrip("while-frozen")
    assert not c.seen("done", "j")

    c.cont()
    done = c.expect("done", "j")
    assert_value(done, big, joined=True)
    assert done["token"] == started["token"]
    assert_value(b.expect("done", "l"), big, joined=False)
    assert h.runs_of("k") == [(b.pid, "k", started["token"])]


def test_a_frozen_joiner_does_not_hold_up_the_leaders_call(h: Harness) -> None:
    """A leader's call returns once the coordinator read its landing, though the ack
    (and the key lock) waits for a frozen joiner's buffer."""
    a = h.spawn_warm("a")  # the coordinator
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    big = "x" * (2 * 1024 * 1024)  # more than c's socket takes while it reads nothing
    b.call("l", "k", h.work(block=True, return_chars=len(big)))
    b.expect("started", "l")
    c.call("j", "k", h.work())
    c.expect("joined", "j")

    c.stop()
    b.release("l")
    assert_value(b.expect("done", "l"), big, joined=False)
    assert key_lock_held(h, "k")  # not acknowledged yet: c's copy is still buffered
    a.roundtrip("while-frozen")
    c.cont()
    assert_value(c.expect("done", "j"), big, joined=True)


def test_pickle_codec_shares_one_run(h: Harness) -> None:
    a = h.spawn_warm("a", codec="pickle")
    b = h.spawn_warm("b", codec="pickle")
    a.call("l", "k", h.work(block=True, **{"return": {"a": [1, "two", None]}}))
    a.expect("started", "l")
    b.call("j", "k", h.work())
    b.expect("joined", "j")
    a.release("l")
    assert_value(a.expect("done", "l"), {"a": [1, "two", None]}, joined=False)
    assert_value(b.expect("done", "j"), {"a": [1, "two", None]}, joined=True)


# -- closing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("leader_is", "mode"),
    [
        ("client", "async"),
        ("client", "sync"),
        ("coordinator", "async"),
    ],
)
def test_closing_the_leaders_group_interrupts_joiners_and_keeps_the_key_lock(
    h: Harness, leader_is: str, mode: str
) -> None:
    a = h.spawn_warm("a")  # the coordinator
    if leader_is == "coordinator":
        leader, a = a, h.spawn_warm("other")
    else:
        leader = h.spawn_warm("leader")
    j = h.spawn_warm("j")
    leader.call("l", "k", h.work(block=True, **{"return": "late"}), mode=mode)
    started = leader.expect("started", "l")
    j.call("j1", "k", h.work())
    j.expect("joined", "j1")

    leader.send(cmd="close", group="g0")
    closed = leader.expect("closed")  # close() does not wait for running work
    assert closed["error"] is None
    if mode == "async":
        # An async leader waits for its work (a task the group owns): closing ends
        # the wait. (A sync leader runs the work in its own thread: see below.)
        assert_error(leader.expect("done", "l"), "GroupClosedError")
    # docs/api.md: the flights this process leads are interrupted for their joiners
    # elsewhere at close, while the work runs on.
    assert_error(j.expect("done", "j1", timeout=10), "FlightInterruptedError")

    # The closed group's work still runs and holds the key lock: a new call waits.
    assert key_lock_held(h, "k")
    j.call("j2", "k", h.work(**{"return": "mine"}))
    j.roundtrip("probe")  # the coordinator answered a later request of j ...
    a.roundtrip("probe")
    assert not j.seen("done", "j2")  # ... but j2 neither led nor ended
    assert h.runs_of("k") == [(leader.pid, "k", started["token"])]

    leader.release("l")  # the work ends, the key lock frees: j2 leads
    done = j.expect("done", "j2")
    assert_value(done, "mine", joined=False)
    assert done["token"] > started["token"]
    assert [entry[0] for entry in h.runs_of("k")] == [leader.pid, j.pid]
    if mode == "sync":
        assert_error(leader.expect("done", "l"), "GroupClosedError")
    # A closed group rejects every call.
    leader.call("x", "other", h.work())
    assert_error(leader.expect("done", "x"), "GroupClosedError")


def test_closing_the_coordinator_hands_over(h: Harness) -> None:
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    c = h.spawn_warm("c")
    b.call("l", "k", h.work(block=True, **{"return": 7}))
    started = b.expect("started", "l")
    c.call("j", "k", h.work())
    c.expect("joined", "j")
    a.send(cmd="close", group="g0")
    assert a.expect("closed")["error"] is None
    new = h.coordinator_pid(not_pid=a.pid)
    assert new in (b.pid, c.pid)
    b.release("l")
    assert_value(b.expect("done", "l"), 7, joined=False)
    done = c.expect("done", "j")
    assert_value(done, 7, joined=True)
    assert done["token"] == started["token"]
    assert h.epoch() == 2
    assert len(h.runs_of("k")) == 1
