"""HTTPS and WSS: the ssl.SSLContext of `[server] tls_cert` and `tls_key`, checked at start.

Browsers give a page the microphone (getUserMedia) only on a secure origin, https:// or
localhost, so a server used from another machine serves HTTPS; aiohttp then serves the
Realtime WebSocket as WSS on the same port. Every way the files can be wrong (one without
the other, missing, unreadable, not PEM, a key that is not the certificate's) stops the
start with one line naming the file, before the model is loaded. A certificate outside its
validity period still loads (a browser's user may click through), but `validity_warning`
says so at start: the page would otherwise fail in the browser with nothing in the log.
"""

from __future__ import annotations

import ssl
from datetime import datetime
from pathlib import Path

from kimiaudio.config import Config
from kimiaudio.errors import KimiAudioError


class _EncryptedKey(Exception):
    """The private key asked for a passphrase."""


def _no_passphrase() -> bytes:
    raise _EncryptedKey


def _readable(config: Config, key: str) -> Path:
    path = config.resolve(getattr(config.server, key))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise KimiAudioError(f"server.{key}: {path}: cannot be read ({exc.strerror or exc})") from None
    if b"-----BEGIN " not in data:
        raise KimiAudioError(f"server.{key}: {path}: not a PEM file (expected -----BEGIN ...-----)")
    return path


def ssl_context(config: Config) -> ssl.SSLContext | None:
    """The server's TLS context, or None for plain HTTP; raises KimiAudioError naming the file."""
    server = config.server
    if not server.tls_cert and not server.tls_key:
        return None
    if not (server.tls_cert and server.tls_key):
        given, missing = ("tls_cert", "tls_key") if server.tls_cert else ("tls_key", "tls_cert")
        raise KimiAudioError(
            f"server.{given} is set but server.{missing} is not: HTTPS needs both (--tls-cert and --tls-key)"
        )
    cert, key = _readable(config, "tls_cert"), _readable(config, "tls_key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_verify_locations(cafile=str(cert))  # parses the certificate alone, to name it
    except ssl.SSLError as exc:
        raise KimiAudioError(f"server.tls_cert: {cert}: not a usable PEM certificate ({exc.reason or exc})") from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        # A password callback, so that OpenSSL never prompts on the terminal for a passphrase.
        context.load_cert_chain(str(cert), str(key), password=_no_passphrase)
    except _EncryptedKey:
        raise KimiAudioError(
            f"server.tls_key: {key}: is encrypted with a passphrase; give the key unencrypted "
            f"(openssl pkey -in {key} -out KEY.pem)"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        if "MISMATCH" in str(exc).upper():
            raise KimiAudioError(f"server.tls_key: {key}: is not the private key of the certificate {cert}") from None
        raise KimiAudioError(
            f"server.tls_key: {key}: not a usable PEM private key (expected an unencrypted "
            "-----BEGIN PRIVATE KEY----- block)"
        ) from None
    return context


def validity_warning(config: Config, now: datetime) -> str | None:
    """A line naming the certificate if `now` (aware) is outside its validity period, else None."""
    if not config.server.tls_cert:
        return None
    # Imported here: only a server with a certificate needs it (a declared dependency, but one a
    # trimmed install, such as the GPU machine's, may lack).
    from cryptography import x509

    cert = config.resolve(config.server.tls_cert)
    try:
        parsed = x509.load_pem_x509_certificate(cert.read_bytes())
    except (OSError, ValueError):
        return None  # ssl_context has said what is wrong with the file
    if now > parsed.not_valid_after_utc:
        when = f"expired on {parsed.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    elif now < parsed.not_valid_before_utc:
        when = f"not valid before {parsed.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    else:
        return None
    return f"warning: server.tls_cert: {cert}: {when}; browsers will refuse the page"
