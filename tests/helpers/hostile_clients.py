"""What hostile or careless clients send: a real SDP offer, raw bytes over a socket, every route
of the app; and what an error message must never show."""

from __future__ import annotations

import asyncio
import re

# What an error message must never show: internal exception names or a traceback.
INTERNAL_NAMES = re.compile(r"Traceback|\b[A-Za-z]*(Error|Exception)\b")


async def offer_sdp() -> str:
    """A real offer from an aiortc peer (microphone track + data channel), as a browser sends."""
    from aiortc import RTCPeerConnection

    from kimiaudio.bench.loopback_client import ScriptedMic

    pc = RTCPeerConnection()
    pc.createDataChannel("oai-events")
    pc.addTrack(ScriptedMic())
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


async def raw_request(
    port: int, head: str, body: bytes = b"", pause_s: float = 0.0, send_rest: bool = True, read_timeout: float = 30.0
) -> tuple[int, bytes]:
    """Send `head` (request line and headers) and `body` over a plain socket; with `pause_s`, the
    body's first half, a pause, then its second half; with `send_rest=False`, only the first
    half. -> (status, response body); status 0 if the server closed without an answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        cut = len(body) // 2 if pause_s or not send_rest else len(body)
        writer.write(f"{head}\r\n\r\n".encode("latin-1") + body[:cut])
        await writer.drain()
        if send_rest and pause_s:
            await asyncio.sleep(pause_s)
            writer.write(body[cut:])
            await writer.drain()
        head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), read_timeout)
        length = int(re.search(rb"(?i)content-length: *(\d+)", head_bytes).group(1))
        content = await asyncio.wait_for(reader.readexactly(length), read_timeout)
    except asyncio.IncompleteReadError:
        return 0, b""
    finally:
        writer.close()
    return int(head_bytes.split()[1]), content


def post_head(port: int, path: str, length: int, content_type: str = "application/json", **headers: str) -> str:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Content-Type: {content_type}",
        f"Content-Length: {length}",
        "Connection: close",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
    ]
    return "\r\n".join(lines)


def route_templates(app) -> list[tuple[str, str]]:
    """(method, path template) of every route of the app and of its sub-applications (/v1),
    static files excepted; a catch-all route ("*", e.g. /v1's OpenAI-shaped 404) is listed
    under each real method."""
    found = []
    for resource in app.router.resources():
        info = resource.get_info()
        if "app" in info:  # a sub-application: its resources carry its prefix already
            found += route_templates(info["app"])
            continue
        if "directory" in info:
            continue
        template = info.get("formatter") or info.get("path")
        for route in resource:
            methods = ("GET", "POST", "DELETE") if route.method == "*" else (route.method,)
            found += [(method, template) for method in methods if method != "HEAD"]
    return found


def fill_template(template: str, **values: str) -> str:
    """A route template with each {name} replaced (values given, else "0")."""
    return re.sub(r"{(\w+)}", lambda m: str(values.get(m.group(1), "0")), template)
