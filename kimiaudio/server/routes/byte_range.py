"""A stored body answered whole or by one byte range (RFC 9110 Range requests).

A media element asks for ranges to seek, and Safari plays audio only from a server that
answers them. One plain range is served (`bytes=A-B`, `bytes=A-`, `bytes=-N`, as aiohttp's
`http_range` parses them); any other Range header is ignored and the whole body is the
answer, as RFC 9110 allows. A range that starts past the end is 416 with the body's size.
"""

from __future__ import annotations

from aiohttp import hdrs, web

from kimiaudio.server.api_error import ApiError


def ranged_response(request: web.Request, body: bytes, content_type: str, headers: dict[str, str]) -> web.Response:
    headers = {**headers, "Accept-Ranges": "bytes"}
    wanted = None
    if hdrs.RANGE in request.headers:
        try:
            wanted = request.http_range
        except ValueError:
            pass  # not one plain byte range: the whole body
    if wanted is None:
        return web.Response(body=body, content_type=content_type, headers=headers)
    size = len(body)
    start = wanted.start if wanted.start >= 0 else max(size + wanted.start, 0)  # (negative: the last N bytes)
    stop = size if wanted.stop is None else min(wanted.stop, size)
    if start >= stop:
        raise ApiError(
            416,
            "range_not_satisfiable",
            f"{request.headers[hdrs.RANGE][:80]!r}: the body is {size} bytes",
            headers={"Content-Range": f"bytes */{size}"},
        )
    return web.Response(
        status=206,
        body=body[start:stop],
        content_type=content_type,
        headers={**headers, "Content-Range": f"bytes {start}-{stop - 1}/{size}"},
    )
