"""The demo page's sign-in, and its backend for ephemeral keys: the page never keeps the API key.

    POST /api/signin          {"api_key": KEY} -> a sign-in cookie (HttpOnly, SameSite=Strict)
    POST /api/signout         forget this browser's sign-in
    POST /api/client_secrets  an ephemeral Realtime key, as POST /v1/realtime/client_secrets

A real app keeps its OpenAI key on its backend and hands the browser ephemeral keys. The demo
page has no backend but this server, so this server plays that part: the person types the API
key once, the page sends it here and forgets it; what the browser keeps is a sign-in cookie
(a random key of its own, stored by its hash in the shared database: store/access_keys.py)
that scripts cannot read and other sites cannot send (SameSite=Strict; the Origin check
refuses their POSTs too). The cookie grants the page's routes under /api/
(middleware/issued_keys.py), among them POST /api/client_secrets, which mints the `ek_` key
the page then calls POST /v1/realtime/calls with, as OpenAI's browser examples do. The
/v1 routes other than opening a call or session still need the API key itself.
Signing in lasts SIGNIN_S; on a server without an API key there is nothing to sign in to.
"""

from __future__ import annotations

from aiohttp import web

from kimiaudio.server.context import server_context
from kimiaudio.server.ephemeral_keys import MAX_BODY_BYTES, create_client_secret
from kimiaudio.server.inputs.client_address import client_address
from kimiaudio.server.inputs.json_input import read_json_object
from kimiaudio.server.middleware.access import key_matches
from kimiaudio.server.middleware.issued_keys import PAGE_SCOPE, invalid_key, signin_cookie
from kimiaudio.store.access_keys import delete_key, mint_key

SIGNIN_S = 12 * 3600

routes = web.RouteTableDef()


@routes.post("/api/signin")
async def signin(request: web.Request) -> web.Response:
    context = server_context(request)
    body = await read_json_object(request, 4096)
    if not context.access.api_key:
        return web.json_response({"required": False})
    typed = body.get("api_key")
    client = client_address(request, context.access.trusted_proxies)
    context.key_guesses.check(client)
    if not key_matches(typed if isinstance(typed, str) else None, context.access.api_key):
        if typed:  # an empty form is no guess
            context.key_guesses.wrong(client)
        raise invalid_key("that is not this server's API key")
    key, record = await mint_key(context.store, "", PAGE_SCOPE, SIGNIN_S, issuer=context.access.api_key)
    response = web.json_response({"required": True, "expires_at": int(record.expires_at)})
    # Secure over TLS, also where a front ends it (deploy/haproxy.cfg sets X-Forwarded-Proto). The
    # header is the client's to forge, but all it can do is keep its own cookie off plain HTTP.
    secure = request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"
    name = signin_cookie(request)
    response.set_cookie(name, key, max_age=SIGNIN_S, path="/", httponly=True, samesite="Strict", secure=secure)
    return response


@routes.post("/api/signout")
async def signout(request: web.Request) -> web.Response:
    name = signin_cookie(request)
    key = request.cookies.get(name)
    if key:
        context = server_context(request)
        await delete_key(context.store, key, context.access.api_key)
    response = web.json_response({"signed_out": True})
    response.del_cookie(name, path="/")
    return response


@routes.post("/api/client_secrets")
async def page_client_secret(request: web.Request) -> web.Response:
    """The page's backend: an ephemeral key for the signed-in page (body as OpenAI's)."""
    body = await read_json_object(request, MAX_BODY_BYTES)
    return web.json_response(await create_client_secret(server_context(request), body))
