"""Cross-origin requests from the allowed origins (`server.allowed_origins`): an app's page,
served from the app's own origin, calling this server from the browser, as OpenAI's WebRTC
examples call OpenAI's API (POST /v1/realtime/calls with an ephemeral key, the SDP in the
body, the call id read from `Location`).

- A preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin is answered
  204 with the methods and headers it may use, before the API key is looked for (a browser
  sends none with a preflight); from any other origin it is a 403 forbidden_origin.
- Every answer to a request from an allowed origin, errors and streams included, says so
  (Access-Control-Allow-Origin, Vary: Origin) and lets the page read `Location` and
  `Retry-After`: `cors_headers` adds them as the answer is prepared (a streamed answer is
  prepared by its handler, before any middleware sees it).
No credentials go cross-origin (no Access-Control-Allow-Credentials): the page's sign-in
cookie is for the server's own page, which is same-origin and needs none of this. The key,
Host and Origin checks themselves are access.py's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.middleware.access import AccessPolicy

METHODS = "GET, POST, DELETE, OPTIONS"
EXPOSED = "Location, Retry-After"
MAX_AGE_S = 600  # how long a browser may keep a preflight's answer
MAX_REQUESTED_HEADERS = 2048  # an SDK's own headers (X-Stainless-*, OpenAI-Beta...) fit


def cors_middleware(policy: AccessPolicy) -> Middleware:
    """The app's outermost middleware: preflights answered (every other answer gets its headers
    from `cors_headers`)."""

    @web.middleware
    async def preflights(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and origin is not None and "Access-Control-Request-Method" in request.headers:
            if not policy.allows_origin(origin):
                raise ApiError(403, "forbidden_origin", f"the origin {origin[:100]!r} is not allowed cross-origin")
            return web.Response(status=204, headers=_preflight_headers(request, origin))
        return await handler(request)

    return preflights


def cors_headers(policy: AccessPolicy) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """The app's on_response_prepare hook: an answer to an allowed origin says so."""

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and policy.allows_origin(origin):
            response.headers.update(_answer_headers(origin))

    return add_headers


def _answer_headers(origin: str) -> dict[str, str]:
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Expose-Headers": EXPOSED, "Vary": "Origin"}


def _preflight_headers(request: web.Request, origin: str) -> dict[str, str]:
    requested = request.headers.get("Access-Control-Request-Headers", "")[:MAX_REQUESTED_HEADERS]
    return {
        **_answer_headers(origin),
        "Access-Control-Allow-Methods": METHODS,
        "Access-Control-Allow-Headers": requested or "Authorization, Content-Type",
        "Access-Control-Max-Age": str(MAX_AGE_S),
    }
