"""HTTPS and WSS (`[server] tls_cert` / `tls_key`, server/tls.py) with a self-signed certificate
made here by the openssl CLI: a real `serve` answers HTTPS requests and a Realtime WebSocket
over WSS; missing or mismatched files stop the start with one line naming the file; a
certificate outside its validity period (made with `cryptography`, dated as needed) starts
with a warning naming it."""

import json
import os
import shutil
import ssl
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kimiaudio.config import load_config
from kimiaudio.server.tls import validity_warning

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


def dated_certificate(directory: Path, not_before: datetime, not_after: datetime) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "dated.pem", directory / "dated.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_a_certificate_outside_its_validity_is_named_by_a_warning(tmp_path):
    start = datetime(2030, 1, 1, tzinfo=UTC)
    cert, key = dated_certificate(tmp_path, start, start + timedelta(days=30))
    config = load_config(overrides={"server": {"tls_cert": str(cert), "tls_key": str(key)}})
    assert validity_warning(config, start + timedelta(days=1)) is None
    before = validity_warning(config, start - timedelta(days=1))
    assert before is not None and str(cert) in before and "not valid before 2030-01-01" in before
    after = validity_warning(config, start + timedelta(days=31))
    assert after is not None and str(cert) in after and "expired on 2030-01-31" in after
    assert validity_warning(load_config(), start) is None  # plain HTTP


def test_serve_with_an_expired_certificate_starts_and_says_so(tmp_path):
    now = datetime.now(UTC)
    cert, key = dated_certificate(tmp_path, now - timedelta(days=60), now - timedelta(days=30))
    proc = start_serve(tmp_path, free_port(), extra_args=("--tls-cert", str(cert), "--tls-key", str(key)))
    try:
        warnings = [line for line in proc.output_lines if "expired on" in line]
        assert warnings and all(str(cert) in line for line in warnings), proc.output_lines
    finally:
        stop_serve(proc)


def test_the_server_imports_without_cryptography():
    """Only a server with a certificate reads one: an install without cryptography (the GPU
    machine's trimmed one) still serves plain HTTP."""
    blocked = "import sys; sys.modules['cryptography'] = None; import kimiaudio.server.serve, kimiaudio.server.tls"
    done = subprocess.run([sys.executable, "-c", blocked], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
