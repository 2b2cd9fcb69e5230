"""Cross-origin requests from the allowed origins (`server.allowed_origins`): an app's page,
served from the app's own origin, calling this server from the browser, as OpenAI's WebRTC
examples call OpenAI's API (POST /v1/realtime/calls with an ephemeral key, the SDP in the
body, the call id read from `Location`).

- A preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin is answered
  204 with the methods and headers it may use, before the API key is looked for (a browser
  sends none with a preflight); from any other origin it is a 403 forbidden_origin.
- Every answer to a request from an allowed origin, errors included, says so
  (Access-Control-Allow-Origin, Vary: Origin) and lets the page read `Location` and
  `Retry-After`.
No credentials go cross-origin (no Access-Control-Allow-Credentials): the page's sign-in
cookie is for the server's own page, which is same-origin and needs none of this. The key,
Host and Origin checks themselves are access.py's.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.middleware.access import AccessPolicy

METHODS = "GET, POST, DELETE, OPTIONS"
EXPOSED = "Location, Retry-After"
MAX_AGE_S = 600  # how long a browser may keep a preflight's answer
MAX_REQUESTED_HEADERS = 2048  # an SDK's own headers (X-Stainless-*, OpenAI-Beta...) fit


def cors_middleware(policy: AccessPolicy) -> Middleware:
    """The app's outermost middleware: preflights answered, allowed origins told so."""

    @web.middleware
    async def cross_origin(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        allowed = origin is not None and policy.allows_origin(origin)
        if request.method == "OPTIONS" and origin is not None and "Access-Control-Request-Method" in request.headers:
            if not allowed:
                raise ApiError(403, "forbidden_origin", f"the origin {origin[:100]!r} is not allowed cross-origin")
            return web.Response(status=204, headers=_preflight_headers(request, origin))
        if not allowed or origin is None:
            return await handler(request)
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # an error answer (ApiError): the page may read it too
            exc.headers.update(_answer_headers(origin))
            raise
        if not response.prepared:  # (a WebSocket's headers are sent already; CORS is not for it)
            response.headers.update(_answer_headers(origin))
        return response

    return cross_origin


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
