"""HAProxy for the tests, running the shipped `deploy/haproxy.cfg` as it is: the addresses go in
through the environment variables the file reads (KIMIAUDIO_FRONT, KIMIAUDIO_INSTANCE_1..2,
KIMIAUDIO_HAPROXY_STATS), never through a copy of the file.

    with HaproxyFront(["127.0.0.1:8081", "127.0.0.1:8082"]) as front:
        front.url                      # http://127.0.0.1:PORT, where clients connect
        front.wait_for_states({"kimi1": "UP", "kimi2": "UP"})
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy.cfg"


class HaproxyUnavailable(RuntimeError):
    """The haproxy binary is not installed."""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HaproxyFront:
    def __init__(self, instances: list[str]):
        self.binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
        if self.binary is None:
            raise HaproxyUnavailable("haproxy was not found (install Debian's `haproxy` package)")
        self.port, self.stats_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "KIMIAUDIO_FRONT": f"127.0.0.1:{self.port}",
            "KIMIAUDIO_HAPROXY_STATS": f"127.0.0.1:{self.stats_port}",
        }
        self.env.pop("KIMIAUDIO_API_KEY", None)
        for i, address in enumerate(instances, 1):
            self.env[f"KIMIAUDIO_INSTANCE_{i}"] = address
        self.output_lines: list[str] = []
        self.proc: subprocess.Popen | None = None

    def start(self) -> HaproxyFront:
        check = subprocess.run([self.binary, "-c", "-f", str(CONFIG)], env=self.env, capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c -f {CONFIG} failed:\n{check.stdout}{check.stderr}")
        # -db: stay in the foreground, logs on stdout (the file's `log stdout`).
        self.proc = subprocess.Popen(
            [self.binary, "-db", "-f", str(CONFIG)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 120  # catches a hang: a loaded machine starts it slowly
        while time.monotonic() < deadline:
            try:
                self.states()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("haproxy exited:\n" + "".join(self.output_lines)) from None
                time.sleep(0.1)
        raise RuntimeError("haproxy did not start:\n" + "".join(self.output_lines))

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.output_lines.append(line)

    def states(self) -> dict[str, str]:
        """{server name: its state as HAProxy sees it (UP, DOWN, "UP 1/2", ...)} of the backend."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5) as resp:
            rows = csv.DictReader(io.StringIO(resp.read().decode().lstrip("# ")))
            return {
                row["svname"]: row["status"]
                for row in rows
                if row["pxname"] == "kimiaudio" and row["svname"] not in ("BACKEND", "FRONTEND")
            }

    def wait_for_states(self, wanted: dict[str, str], timeout: float = 120.0) -> None:
        """Wait until each named server is in the wanted state (health checks run every 2 s)."""
        deadline = time.monotonic() + timeout
        states = self.states()
        while any(states.get(name) != state for name, state in wanted.items()):
            if time.monotonic() > deadline:
                raise AssertionError(f"HAProxy's servers are {states}, not {wanted}")
            time.sleep(0.2)
            states = self.states()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> HaproxyFront:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
