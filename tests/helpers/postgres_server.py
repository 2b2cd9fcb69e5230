"""A throwaway PostgreSQL server for the tests: Debian's `postgresql` binaries, a data directory
in a temporary folder, listening on a free loopback port with a password-authenticated user.

PostgreSQL refuses to run as root, and the tests run as root in CI: then the server runs as the
unprivileged system user `kimiaudio-pg` (created with useradd if missing) through `runuser`,
and owns its data directory. `stop()` and `start()` stop and restart the same server on the
same port (the "database lost while serving" tests); `close()` stops it and removes its files.

    with PostgresServer() as pg:
        url = pg.create_database("t1")   # postgresql://kimiaudio:PASSWORD@127.0.0.1:PORT/t1
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from helpers.serve_process import free_port

RUN_AS = "kimiaudio-pg"  # the system user the server runs as when the tests run as root
USER = "kimiaudio"  # the database superuser the tests connect as (password-authenticated)


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed."""


def postgres_bindir() -> Path:
    """Where initdb and pg_ctl are: on PATH, or Debian's versioned folder (the newest)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not candidates:
        raise PostgresUnavailable("PostgreSQL's initdb was not found (install Debian's `postgresql` package)")
    return Path(candidates[-1]).parent


def _ensure_system_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )


class PostgresServer:
    def __init__(self) -> None:
        self.bindir = postgres_bindir()
        self.password = secrets.token_hex(12)
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="kimiaudio-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            _ensure_system_user(RUN_AS)
            self._as_user = ["runuser", "-u", RUN_AS, "--"]
            shutil.chown(self.root, RUN_AS, RUN_AS)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self._as_user:
            shutil.chown(pwfile, RUN_AS, RUN_AS)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "-E",
            "UTF8",
            # The C locale, the strictest a server has: its character classes know only ASCII
            # (search must not lose the words of other scripts there).
            "--no-locale",
            "--no-sync",
        )
        pwfile.unlink()
        self.running = False

    def _run(self, tool: str, *args: str) -> None:
        proc = subprocess.run(
            [*self._as_user, str(self.bindir / tool), *args], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr.strip()}\n{log[-2000:]}")

    def start(self) -> PostgresServer:
        # Loopback TCP only (no Unix socket); fsync off: a test database need not survive a power cut.
        options = f"-p {self.port} -h 127.0.0.1 -k '' -c fsync=off -c full_page_writes=off -c max_connections=200"
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log), "-o", options)
        self.running = True
        return self

    def stop(self) -> None:
        if self.running:
            self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data))
            self.running = False

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def url(self, dbname: str = "postgres", password: str | None = None) -> str:
        return f"postgresql://{USER}:{password or self.password}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = name or f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
