"""flightgroup.directory.fs: the file-system check, directories, durable writes and the
epoch, on real files in tmp_path (only the mountinfo text is ever made up)."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from flightgroup.directory import fs
from flightgroup.directory.epochs import EpochError, next_epoch, read_epoch
from flightgroup.errors import NetworkDirectoryError

linux_only = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.path.exists("/proc/self/mountinfo")),
    reason="reads /proc/self/mountinfo",
)


def mountinfo(*mounts: tuple[str, str]) -> str:
    """A mountinfo text with one line per (escaped mount point, fstype)."""
    lines = [
        f"{20 + i} 1 0:{30 + i} / {point} rw,relatime shared:{i} - {fstype} src{i} rw"
        for i, (point, fstype) in enumerate(mounts)
    ]
    return "\n".join(lines) + "\n"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_epochs(directory: Path, first: str | None, second: str | None) -> None:
    """Set flight.epoch and state/epoch to the given text; None removes the file."""
    for path, text in (
        (directory / fs.EPOCH_NAME, first),
        (directory / fs.STATE / "epoch", second),
    ):
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)


def write_token(directory: Path, key: str, token: int | str) -> None:
    Path(fs.key_lock_path(str(directory), key)).write_text(f"{token}\n")


@pytest.fixture
def group_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "flights"
    fs.ensure_directory(str(directory))
    return directory


@pytest.fixture(autouse=True)
def _clean_local_cache() -> None:
    fs._local_cache.clear()


# --- file_system_of and check_local -------------------------------------------------------


@linux_only
def test_a_real_local_directory_has_a_type_and_is_local(tmp_path: Path) -> None:
    fstype = fs.file_system_of(str(tmp_path))
    assert isinstance(fstype, str) and fstype
    assert fstype not in fs.NETWORK_FILE_SYSTEMS
    fs.check_local(str(tmp_path))  # raises nothing
    assert fs._local_cache == {os.path.realpath(tmp_path): True}


@linux_only
def test_a_missing_path_is_judged_by_its_nearest_existing_ancestor(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "yet" / "here"
    assert fs.file_system_of(str(missing)) == fs.file_system_of(str(tmp_path))
    fs.check_local(str(missing))


def test_longest_mount_point_wins_with_nested_mounts() -> None:
    text = mountinfo(
        ("/", "ext4"), ("/srv", "xfs"), ("/srv/data", "nfs4"), ("/srv/data/x", "tmpfs")
    )
    assert fs.file_system_of("/srv/data/x/y", text) == "tmpfs"
    assert fs.file_system_of("/srv/data/y", text) == "nfs4"
    assert fs.file_system_of("/srv/data", text) == "nfs4"
    assert fs.file_system_of("/srv/other", text) == "xfs"
    assert fs.file_system_of("/elsewhere", text) == "ext4"


def test_mount_points_match_on_component_boundaries() -> None:
    text = mountinfo(("/", "ext4"), ("/mnt/a", "nfs"))
    assert fs.file_system_of("/mnt/ab", text) == "ext4"
    assert fs.file_system_of("/mnt/ab/c", text) == "ext4"
    assert fs.file_system_of("/mnt/a/c", text) == "nfs"


def test_escaped_mount_points_are_decoded() -> None:
    text = mountinfo(("/", "ext4"), (r"/mnt/my\040share", "cifs"), (r"/mnt/back\134slash", "nfs"))
    assert fs.file_system_of("/mnt/my share/dir", text) == "cifs"
    assert fs.file_system_of("/mnt/my", text) == "ext4"
    assert fs.file_system_of("/mnt/back\\slash", text) == "nfs"


def test_optional_fields_and_fuse_subtypes() -> None:
    text = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "40 27 0:50 / /mnt/gluster rw shared:7 master:3 - fuse.glusterfs srv:/vol rw\n"
        "41 27 0:51 / /mnt/ssh rw - fuse.sshfs me@host:/ rw\n"
        "42 27 0:52 / /mnt/local rw - fuse.bindfs /data rw\n"
        "garbage line without a separator\n"
    )
    assert fs.file_system_of("/mnt/gluster/x", text) == "fuse.glusterfs"
    assert fs.file_system_of("/mnt/ssh", text) == "fuse.sshfs"
    assert fs.file_system_of("/mnt/local/x", text) == "fuse.bindfs"
    fs.check_local("/mnt/local/x", text)  # FUSE in general is local
    with pytest.raises(NetworkDirectoryError):
        fs.check_local("/mnt/ssh/x", text)


def test_a_later_mount_on_the_same_point_hides_the_earlier() -> None:
    text = mountinfo(("/", "ext4"), ("/mnt", "nfs"), ("/mnt", "tmpfs"))
    assert fs.file_system_of("/mnt/x", text) == "tmpfs"


def test_no_match_is_unknown_and_counts_as_local() -> None:
    assert fs.file_system_of("/srv/x", mountinfo(("/mnt", "nfs"))) is None
    assert fs.file_system_of("/srv/x", "") is None
    fs.check_local("/srv/x", "")
    assert fs._local_cache == {}


@pytest.mark.parametrize(
    ("fstype", "name"),
    [("nfs", "NFS"), ("nfs4", "NFSv4"), ("cifs", "CIFS/SMB"), ("fuse.glusterfs", "GlusterFS")],
)
def test_check_local_raises_for_a_network_file_system(fstype: str, name: str) -> None:
    text = mountinfo(("/", "ext4"), ("/mnt/share", fstype))
    assert fs.file_system_of("/mnt/share/flights", text) == fstype
    with pytest.raises(NetworkDirectoryError) as caught:
        fs.check_local("/mnt/share/flights", text)
    assert caught.value.directory == "/mnt/share/flights"
    assert caught.value.file_system == name
    assert name in str(caught.value) and "/mnt/share/flights" in str(caught.value)
    assert fs._local_cache == {}  # a given mountinfo never touches the cache


def test_every_named_network_type_is_refused() -> None:
    for fstype, name in fs.NETWORK_FILE_SYSTEMS.items():
        with pytest.raises(NetworkDirectoryError) as caught:
            fs.check_local("/net/x", mountinfo(("/", "ext4"), ("/net", fstype)))
        assert caught.value.file_system == name
    for needed in ("nfs", "nfs4", "cifs", "smb3", "ceph", "9p", "lustre", "glusterfs", "afs"):
        assert needed in fs.NETWORK_FILE_SYSTEMS


@linux_only
def test_a_local_answer_is_cached_for_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs.check_local(str(tmp_path))
    assert fs._local_cache == {os.path.realpath(tmp_path): True}

    def no_lookup(path: str, mountinfo: str | None = None) -> str | None:
        raise AssertionError("the cached answer should have been used")

    monkeypatch.setattr(fs, "file_system_of", no_lookup)
    fs.check_local(str(tmp_path))
    fs.check_local(str(tmp_path / "." / ""))  # the same real path
    monkeypatch.undo()
    # A made-up mountinfo bypasses the cache.
    with pytest.raises(NetworkDirectoryError):
        fs.check_local(str(tmp_path), mountinfo(("/", "nfs")))


# --- ensure_directory ---------------------------------------------------------------------


def test_ensure_directory_makes_every_missing_directory_0700(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    old = os.umask(0o022)
    try:
        fs.ensure_directory(str(target))
    finally:
        os.umask(old)
    for directory in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert mode_of(directory) == 0o700
    assert mode_of(target / fs.KEY_LOCKS) == 0o700
    assert mode_of(target / fs.STATE) == 0o700


def test_ensure_directory_sets_0700_even_under_a_strict_umask(tmp_path: Path) -> None:
    target = tmp_path / "strict"
    old = os.umask(0o277)  # would leave the owner without write
    try:
        fs.ensure_directory(str(target))
    finally:
        os.umask(old)
    assert mode_of(target) == 0o700
    assert mode_of(target / fs.STATE) == 0o700


def test_ensure_directory_names_the_directory_and_the_component_in_the_way(
    tmp_path: Path,
) -> None:
    """A file in the path: NotADirectoryError naming the directory and that file."""
    (tmp_path / "afile").touch()
    target = tmp_path / "afile" / "sub" / "flights"
    with pytest.raises(NotADirectoryError) as caught:
        fs.ensure_directory(str(target))
    assert caught.value.strerror == (
        f"cannot create the group's directory {str(target)!r}: "
        f"{str(tmp_path / 'afile')!r} is a file, not a directory"
    )
    assert isinstance(caught.value.__cause__, FileExistsError)  # the system's own


def test_a_refused_component_is_said_as_no_permission_naming_it(tmp_path: Path) -> None:
    """(As root no mkdir is refused: the system's error is made here.) EACCES on a
    component: PermissionError naming the directory and the component."""
    target = str(tmp_path / "locked" / "flights")
    refused = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "locked"))
    made = fs.cannot_create(target, refused)
    assert isinstance(made, PermissionError) and made.errno == errno.EACCES
    assert made.strerror == (
        f"cannot create the group's directory {target!r}: no permission to create "
        f"{str(tmp_path / 'locked')!r}"
    )


def test_ensure_directory_leaves_an_existing_directory_alone(tmp_path: Path) -> None:
    target = tmp_path / "existing"
    target.mkdir()
    target.chmod(0o755)
    fs.ensure_directory(str(target))
    fs.ensure_directory(str(target))  # idempotent
    assert mode_of(target) == 0o755
    assert (target / fs.KEY_LOCKS).is_dir() and (target / fs.STATE).is_dir()


def test_ensure_directory_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        fs.ensure_directory(str(tmp_path / "file"))
    with pytest.raises(OSError):
        fs.ensure_directory(str(tmp_path / "file" / "below"))


def test_two_threads_ensure_the_same_directory_at_once(tmp_path: Path) -> None:
    for round_ in range(20):
        target = tmp_path / f"r{round_}" / "deep" / "flights"
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def make(
            target: Path = target,
            barrier: threading.Barrier = barrier,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                barrier.wait()
                fs.ensure_directory(str(target))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=make) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert (target / fs.KEY_LOCKS).is_dir() and (target / fs.STATE).is_dir()
        assert mode_of(target) == 0o700


# --- durable_write ------------------------------------------------------------------------


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_durable_write_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "file"
    fs.durable_write(str(target), "one\n")
    assert target.read_text() == "one\n"
    assert mode_of(target) & 0o077 == 0  # the temp file was made 0600
    fs.durable_write(str(target), "twö")
    assert target.read_bytes() == "twö".encode()
    assert leftovers(tmp_path) == []


def test_durable_write_cleans_up_when_the_replace_fails(tmp_path: Path) -> None:
    target = tmp_path / "a-directory"
    target.mkdir()
    with pytest.raises(OSError):
        fs.durable_write(str(target), "x")
    assert target.is_dir()
    assert leftovers(tmp_path) == []


def test_durable_write_into_a_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fs.durable_write(str(tmp_path / "no" / "file"), "x")
    assert leftovers(tmp_path) == []


def test_durable_write_cleans_up_when_encoding_fails(tmp_path: Path) -> None:
    with pytest.raises(UnicodeEncodeError):
        fs.durable_write(str(tmp_path / "file"), "\udc80")
    assert list(tmp_path.iterdir()) == []


def test_durable_write_makes_its_temp_file_in_the_folder_given(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    seen: list[str] = []
    real_fsync = os.fsync

    def looking_fsync(fd: int) -> None:  # the temp file is written and open: look for it
        seen.extend(leftovers(tmp_path) + [f"scratch/{n}" for n in leftovers(scratch)])
        real_fsync(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", looking_fsync)
        fs.durable_write(str(tmp_path / "file"), "x", temp_directory=str(scratch))
    assert (tmp_path / "file").read_text() == "x"
    assert seen and all(name.startswith("scratch/file.") for name in seen)
    assert leftovers(tmp_path) == leftovers(scratch) == []


# --- next_epoch and read_epoch ------------------------------------------------------------


def epochs(directory: Path) -> tuple[str, str]:
    return (
        (directory / fs.EPOCH_NAME).read_text(),
        (directory / fs.STATE / "epoch").read_text(),
    )


def test_a_fresh_directory_starts_at_1_and_adds_1(group_dir: Path) -> None:
    assert read_epoch(str(group_dir)) is None
    assert next_epoch(str(group_dir)) == 1
    assert epochs(group_dir) == ("1\n", "1\n")
    assert next_epoch(str(group_dir)) == 2
    assert next_epoch(str(group_dir)) == 3
    assert epochs(group_dir) == ("3\n", "3\n")
    assert read_epoch(str(group_dir)) == 3
    assert leftovers(group_dir) == [] and leftovers(group_dir / fs.STATE) == []


def test_a_term_removes_the_temp_files_a_crashed_epoch_write_left(group_dir: Path) -> None:
    # docs/api.md keeps the top level to the named files: the temp files of both epoch copies
    # are made in state/, and a crash between their write and rename leaves them there
    # until the next term (its writer holds flight.lock, so nobody else writes them).
    assert next_epoch(str(group_dir)) == 1
    state = group_dir / fs.STATE
    (state / f"{fs.EPOCH_NAME}.0123.tmp").write_text("7\n")
    (state / "epoch.4567.tmp").write_text("")
    (state / "kept-by-hand").write_text("mine")
    assert next_epoch(str(group_dir)) == 2  # a temp file is never read as a copy
    assert leftovers(state) == [] and leftovers(group_dir) == []
    assert (state / "kept-by-hand").read_text() == "mine"


def test_empty_key_lock_files_do_not_make_a_directory_old(group_dir: Path) -> None:
    Path(fs.key_lock_path(str(group_dir), "k")).touch()
    assert next_epoch(str(group_dir)) == 1


@pytest.mark.parametrize("damage", [None, "", "  \n", "abc", "-3", "1.5", "0x10", "+4", "5 5"])
def test_a_damaged_flight_epoch_recovers_from_state_epoch(
    group_dir: Path, damage: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(4):
        next_epoch(str(group_dir))
    write_epochs(group_dir, damage, "4\n")
    assert read_epoch(str(group_dir)) is None
    with caplog.at_level(logging.WARNING, logger="flightgroup"):
        assert next_epoch(str(group_dir)) == 5
    assert epochs(group_dir) == ("5\n", "5\n")
    assert any(r.levelno == logging.WARNING for r in caplog.records)


def test_a_damaged_state_epoch_is_rewritten_from_flight_epoch(
    group_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_epochs(group_dir, " 41 \n", "garbage")
    with caplog.at_level(logging.WARNING, logger="flightgroup"):
        assert next_epoch(str(group_dir)) == 42
    assert epochs(group_dir) == ("42\n", "42\n")
    assert "garbage" in caplog.text


def test_the_state_folder_is_recreated_if_removed(group_dir: Path) -> None:
    next_epoch(str(group_dir))
    (group_dir / fs.STATE / "epoch").unlink()
    (group_dir / fs.STATE).rmdir()
    assert next_epoch(str(group_dir)) == 2
    assert epochs(group_dir) == ("2\n", "2\n")


def test_the_higher_copy_wins(group_dir: Path) -> None:
    write_epochs(group_dir, "3", "9")
    assert next_epoch(str(group_dir)) == 10
    write_epochs(group_dir, "20", "9")  # a crash between the two writes leaves this
    assert next_epoch(str(group_dir)) == 21
    assert epochs(group_dir) == ("21\n", "21\n")


def test_both_copies_corrupt_recover_from_key_lock_tokens(
    group_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_epochs(group_dir, "", "not a number")
    write_token(group_dir, "a", (7 << 32) | 5)
    write_token(group_dir, "b", (3 << 32) | 900)
    write_token(group_dir, "c", "corrupt")
    Path(fs.key_lock_path(str(group_dir), "d")).touch()  # a lock taken, no token yet
    write_token(group_dir, "e", 2**63)  # not a token: over 63 bits
    with caplog.at_level(logging.WARNING, logger="flightgroup"):
        assert next_epoch(str(group_dir)) == 8
    assert epochs(group_dir) == ("8\n", "8\n")
    assert "recovered epoch 7" in caplog.text


def test_both_copies_missing_with_tokens_recover_from_them(group_dir: Path) -> None:
    write_epochs(group_dir, None, None)
    write_token(group_dir, "a", (12 << 32) | 1)
    assert next_epoch(str(group_dir)) == 13


def test_both_copies_corrupt_without_tokens_is_an_error(group_dir: Path) -> None:
    write_epochs(group_dir, "zzz", "")
    write_token(group_dir, "a", "corrupt")
    with pytest.raises(EpochError) as caught:
        next_epoch(str(group_dir))
    message = str(caught.value)
    assert fs.EPOCH_NAME in message and os.path.join(fs.STATE, "epoch") in message
    assert "'zzz'" in message and "is empty" in message
    assert "write the highest epoch known" in message
    # nothing was changed
    assert (group_dir / fs.EPOCH_NAME).read_text() == "zzz"
    assert (group_dir / fs.STATE / "epoch").read_text() == ""


def test_one_corrupt_copy_and_one_missing_without_tokens_is_an_error(group_dir: Path) -> None:
    write_epochs(group_dir, None, "x" * 10_000)
    with pytest.raises(EpochError, match="is missing") as caught:
        next_epoch(str(group_dir))
    assert len(str(caught.value)) < 2000  # a huge file is quoted in part only


def test_the_fix_the_error_suggests_works(group_dir: Path) -> None:
    write_epochs(group_dir, "bad", "bad")
    with pytest.raises(EpochError):
        next_epoch(str(group_dir))
    (group_dir / fs.EPOCH_NAME).write_text("42\n")
    assert next_epoch(str(group_dir)) == 43


def test_the_last_epoch_cannot_be_followed(group_dir: Path) -> None:
    write_epochs(group_dir, str(2**31 - 2), str(2**31 - 2))
    assert next_epoch(str(group_dir)) == 2**31 - 1  # the highest epoch is still usable
    with pytest.raises(EpochError, match="63 bits"):
        next_epoch(str(group_dir))
    assert read_epoch(str(group_dir)) == 2**31 - 1
    write_epochs(group_dir, "9" * 30, "1")
    with pytest.raises(EpochError):
        next_epoch(str(group_dir))


def test_the_epoch_never_goes_down_across_damage(group_dir: Path) -> None:
    seen = [next_epoch(str(group_dir)) for _ in range(3)]
    damages = [("", None), (None, "x"), ("junk", None)]
    for first, second in damages:
        current = read_epoch(str(group_dir))
        assert current is not None
        if first is not None:
            (group_dir / fs.EPOCH_NAME).write_text(first)
        if second is not None:
            (group_dir / fs.STATE / "epoch").write_text(second)
        seen.append(next_epoch(str(group_dir)))
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert seen[-1] == 6


# --- paths --------------------------------------------------------------------------------


def test_key_lock_path_is_the_sha256_of_the_utf8_key(tmp_path: Path) -> None:
    path = fs.key_lock_path(str(tmp_path), "user:7")
    expected = hashlib.sha256(b"user:7").hexdigest()
    assert path == os.path.join(str(tmp_path), "execution-locks", expected)
    lone = fs.key_lock_path(str(tmp_path), "\ud800")
    assert lone.endswith(hashlib.sha256(b"\xed\xa0\x80").hexdigest())


def test_socket_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert fs.socket_path("flights") == os.path.join(str(tmp_path), "flights", "flight.sock")
    assert fs.socket_path(str(tmp_path)) == os.path.join(str(tmp_path), "flight.sock")
