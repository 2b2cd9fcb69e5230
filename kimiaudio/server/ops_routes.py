"""Operations routes: /metrics (Prometheus), /healthz (the process answers), /readyz (it
should be sent new sessions). Behind the API key like every other route when one is set
(Prometheus sends it with `authorization: {credentials: KEY}`).
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kimiaudio.server.app_keys import admission_key, pipeline_key, ready_key, server_metrics_key, store_key

STORE_CHECK_TIMEOUT_S = 2.0


def setup_ops_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[server_metrics_key].exposed.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """503 while starting, while shutting down, at the session limit (a router then sends new
    sessions elsewhere), when a model worker has stopped (the process needs a restart), or when
    the conversation database does not answer (until it is back: the store reconnects by itself)."""
    app = request.app
    admission = app[admission_key]
    problems = []
    if not app[ready_key].is_set():
        problems.append("the pipeline is not running")
    elif not app[pipeline_key].workers_alive:
        problems.append("the model workers stopped (see the server log)")
    if admission.is_draining:
        problems.append("shutting down")
    elif admission.num_reserved >= admission.max_sessions:
        problems.append(f"full: {admission.num_reserved} of {admission.max_sessions} sessions")
    try:
        await asyncio.wait_for(app[store_key].ping(), STORE_CHECK_TIMEOUT_S)
    except Exception:
        problems.append("the conversation database does not answer")
    body = {
        "status": "not ready" if problems else "ready",
        "problems": problems,
        "instance": app[server_metrics_key].exposed.instance,
        "sessions": {"active": admission.num_reserved, "max": admission.max_sessions},
    }
    return web.json_response(body, status=503 if problems else 200)
