"""A stored body answered whole or by one byte range (RFC 9110 Range requests).

A media element asks for ranges to seek, and Safari plays audio only from a server that
answers them. One plain range is served (`bytes=A-B`, `bytes=A-`, `bytes=-N`, as aiohttp's
`http_range` parses them); any other Range header is ignored and the whole body is the
answer, as RFC 9110 allows. A range that holds no byte of the body (one starting past its
end, the last 0 bytes) is 416 with the body's size. The body has no validator (no ETag: a
turn's audio grows while its answer plays), so an If-Range never matches: the whole body.
"""

from __future__ import annotations

import re

from aiohttp import hdrs, web

from kimiaudio.server.api_error import ApiError

_NO_LAST_BYTES = re.compile(r"bytes=-0+", re.IGNORECASE)  # the last 0 bytes: none


def ranged_response(request: web.Request, body: bytes, content_type: str, headers: dict[str, str]) -> web.Response:
    headers = {**headers, "Accept-Ranges": "bytes"}
    wanted = None
    if hdrs.RANGE in request.headers and hdrs.IF_RANGE not in request.headers:
        try:
            wanted = request.http_range
        except ValueError:
            pass  # not one plain byte range: the whole body
    if wanted is None:
        return web.Response(body=body, content_type=content_type, headers=headers)
    size = len(body)
    if wanted.start < 0:  # the last N bytes
        start = max(size + wanted.start, 0)
    elif _NO_LAST_BYTES.fullmatch(request.headers[hdrs.RANGE]):  # (http_range reads it as "from 0")
        start = size
    else:
        start = wanted.start
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
