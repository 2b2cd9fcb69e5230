"""The multipart form POST /api/voices takes."""

from __future__ import annotations

import aiohttp


def form(name: str | None, data: bytes | None, filename: str = "voice.wav") -> aiohttp.FormData:
    f = aiohttp.FormData(default_to_multipart=True)
    if name is not None:
        f.add_field("name", name)
    if data is not None:
        f.add_field("file", data, filename=filename, content_type="application/octet-stream")
    return f
