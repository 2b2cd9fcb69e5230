"""The demo page and what it asks before it connects.

GET    /                the demo page (static/index.html)
GET    /static/...      its scripts and styles
GET    /api/auth        {"required": bool, "signed_in": bool}: does the server need an API key,
                        and has this browser signed in (routes/signin.py)
GET    /api/status      model, demo flag, ICE servers, sessions, pipeline stats
"""

from __future__ import annotations

import time

from aiohttp import web

from kimiaudio import __version__
from kimiaudio.pipeline.model_stack import DEMO_NOTICE
from kimiaudio.server.context import server_context
from kimiaudio.server.middleware.issued_keys import signed_in
from kimiaudio.server.routes.page_files import STATIC_DIR
from kimiaudio.server.transport.ice_servers import ice_servers

routes = web.RouteTableDef()
routes.static("/static", STATIC_DIR)


@routes.get("/")
async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@routes.get("/api/auth")
async def auth(request: web.Request) -> web.Response:
    """Unauthenticated: tells the page whether to ask for a key (and says nothing else)."""
    context = server_context(request)
    required = bool(context.access.api_key)
    signed = required and await signed_in(lambda: context.store, request, context.access.api_key)
    return web.json_response({"required": required, "signed_in": signed})


@routes.get("/api/status")
async def status(request: web.Request) -> web.Response:
    context = server_context(request)
    stack, pipeline, config = context.stack, context.running_pipeline(), context.config
    is_demo = bool(stack is not None and stack.is_demo)
    body = {
        "status": "ok",
        "version": __version__,
        "model": {"path": str(stack.paths.root) if stack is not None else None, "is_demo": is_demo},
        "demo_weights": is_demo,
        "demo_message": DEMO_NOTICE if is_demo else None,
        "ice_servers": ice_servers(config, time.time()),  # TURN with fresh credentials
        "sessions": {"active": context.sessions.num_reserved, "max": config.server.max_sessions},
        "pipeline": pipeline.stats() if pipeline is not None else None,
    }
    return web.json_response(body)
