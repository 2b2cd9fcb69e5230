"""Operations routes: /metrics (Prometheus), /healthz (the process answers), /readyz (it
should be sent new sessions). Behind the API key like every other route when one is set
(Prometheus sends it with `authorization: {credentials: KEY}`).
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kimiaudio.server.context import server_context

STORE_CHECK_TIMEOUT_S = 2.0


routes = web.RouteTableDef()


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    body = server_context(request).metrics.exposed.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    """503 while starting, while shutting down, at the session limit (a router then sends new
    sessions elsewhere), when a model worker has stopped (the process needs a restart), or when
    the conversation database does not answer (until it is back: the store reconnects by itself)."""
    context = server_context(request)
    sessions = context.sessions
    problems = []
    if not context.ready.is_set() and not sessions.is_draining:  # (a stop clears it: said below)
        problems.append("the pipeline is not running")
    elif not context.pipeline.workers_alive:
        problems.append("the model workers stopped (see the server log)")
    if sessions.is_draining:
        problems.append("shutting down")
    elif sessions.num_reserved >= sessions.max_sessions:
        problems.append(f"full: {sessions.num_reserved} of {sessions.max_sessions} sessions")
    try:
        await asyncio.wait_for(context.store.ping(), STORE_CHECK_TIMEOUT_S)
    except Exception:
        problems.append("the conversation database does not answer")
    body = {
        "status": "not ready" if problems else "ready",
        "problems": problems,
        "instance": context.metrics.exposed.instance,
        "sessions": {"active": sessions.num_reserved, "max": sessions.max_sessions},
    }
    return web.json_response(body, status=503 if problems else 200)
