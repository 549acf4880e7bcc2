"""A throwaway PostgreSQL cluster for tests: initdb in a temporary folder, on 127.0.0.1 and a
free port, stopped at the end. `initdb` refuses root: as root the cluster belongs to the
`postgres` user of the Debian package. The binaries must be installed (`.ci/run` installs the
Debian package `postgresql`): a test that needs them fails without them, it never skips."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def cluster() -> Iterator[str]:
    """A running cluster; yields the URL of a database named ``minions``."""
    bin_dir = binaries()
    if bin_dir is None:
        raise RuntimeError(
            "PostgreSQL is not installed: install the Debian package `postgresql` (`.ci/run` does)"
        )
    folder = Path(tempfile.mkdtemp(prefix="minions-pg-"))
    data = folder / "data"
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    if as_root:
        shutil.chown(folder, "postgres", "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    port = _free_port()

    def run(*command: str) -> None:
        subprocess.run([*prefix, *command], check=True, capture_output=True, timeout=120)

    run(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "minions", "-E", "UTF8")
    options = f"-p {port} -k {folder} -h 127.0.0.1 -c fsync=on -c max_connections=200"
    run(
        str(bin_dir / "pg_ctl"),
        "-D",
        str(data),
        "-o",
        options,
        "-l",
        str(folder / "log"),
        "-w",
        "start",
    )
    _RUNNING[port] = (prefix, bin_dir, data, options, folder / "log")
    try:
        run(
            str(bin_dir / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "minions",
            "minions",
        )
        yield f"postgresql://minions@127.0.0.1:{port}/minions"
    finally:
        _RUNNING.pop(port, None)
        subprocess.run(
            [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=120,
        )
        time.sleep(0.1)
        shutil.rmtree(folder, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """A new empty database in the cluster of `url`."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + f"/{name}"


_RUNNING: dict[int, tuple[list[str], Path, Path, str, Path]] = {}
"""The clusters of `cluster()` running now, by port: how to run pg_ctl on each."""


def pg_ctl(url: str, action: str) -> None:
    """``restart`` (``-m immediate``: as a crash would), ``stop`` (immediate) or ``start``
    the test cluster serving `url`."""
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    prefix, bin_dir, data, options, log = _RUNNING[port]
    command = [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-w"]
    if action in ("restart", "stop"):
        command += ["-m", "immediate"]
    if action in ("restart", "start"):
        command += ["-o", options, "-l", str(log)]
    subprocess.run([*command, action], check=True, capture_output=True, timeout=120)
