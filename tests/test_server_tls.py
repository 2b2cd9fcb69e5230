"""HTTPS and WSS (`[server] tls_cert` / `tls_key`, server/tls.py) with a self-signed certificate
made here by the openssl CLI: a real `serve` answers HTTPS requests and a Realtime WebSocket
over WSS; missing or mismatched files stop the start with one line naming the file."""

import json
import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from helpers.serve_process import ROOT, free_port, start_serve, stop_serve

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl CLI makes the test certificate"),
]


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    return directory, self_signed(directory, "server"), self_signed(directory, "other")


async def test_https_and_wss_with_a_self_signed_certificate(certs, tmp_path):
    directory, (cert, key), _ = certs
    port = free_port()
    # Relative paths are relative to the config file's directory.
    shutil.copy(cert, tmp_path / "cert.pem")
    shutil.copy(key, tmp_path / "key.pem")
    proc = start_serve(tmp_path, port, '[server]\ntls_cert = "cert.pem"\ntls_key = "key.pem"\n')
    try:
        assert any(f"https://127.0.0.1:{port}/" in line for line in proc.output_lines)
        trusted = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{port}/api/status", ssl=trusted) as resp:
                assert resp.status == 200 and "pipeline" in await resp.json()
            async with http.ws_connect(
                f"wss://127.0.0.1:{port}/v1/realtime?model=kimi-audio-7b-instruct", ssl=trusted
            ) as ws:
                assert json.loads((await ws.receive()).data)["type"] == "session.created"
            with pytest.raises(aiohttp.ClientError):  # plain HTTP on the TLS port is not served
                async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    await resp.read()
    finally:
        stop_serve(proc)


def serve_fails(tmp_path: Path, *flags: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kimiaudio",
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            str(free_port()),
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    assert not (tmp_path / "data").exists()  # stopped before loading anything
    return done.stderr.strip().splitlines()


@pytest.mark.parametrize("case", ["missing key", "mismatched key", "cert without key", "key as cert", "encrypted key"])
def test_bad_certificate_files_stop_the_start_with_one_line(certs, tmp_path, case):
    directory, (cert, key), (_, other_key) = certs
    encrypted = tmp_path / "encrypted.key"
    if case == "encrypted key":  # (OpenSSL would ask for its passphrase on the terminal)
        subprocess.run(
            ["openssl", "pkey", "-in", str(key), "-out", str(encrypted), "-aes256", "-passout", "pass:secret"],
            check=True,
            capture_output=True,
        )
    flags, named = {
        "encrypted key": (["--tls-cert", str(cert), "--tls-key", str(encrypted)], "server.tls_key"),
        "missing key": (["--tls-cert", str(cert), "--tls-key", str(directory / "nope.key")], "server.tls_key"),
        "mismatched key": (["--tls-cert", str(cert), "--tls-key", str(other_key)], "server.tls_key"),
        "cert without key": (["--tls-cert", str(cert)], "server.tls_key"),
        "key as cert": (["--tls-cert", str(key), "--tls-key", str(key)], "server.tls_cert"),
    }[case]
    lines = serve_fails(tmp_path, *flags)
    assert len(lines) == 1 and named in lines[0], lines
    if case == "missing key":
        assert "nope.key" in lines[0] and "cannot be read" in lines[0]
    if case == "mismatched key":
        assert str(other_key) in lines[0] and "not the private key" in lines[0]
    if case == "encrypted key":
        assert str(encrypted) in lines[0] and "passphrase" in lines[0]
