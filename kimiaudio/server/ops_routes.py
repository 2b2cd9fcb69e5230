"""Operations routes: /metrics (Prometheus), /healthz (the process answers), /readyz (it
should be sent new sessions). Behind the API key like every other route when one is set
(Prometheus sends it with `authorization: {credentials: KEY}`).
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kimiaudio.server.app_keys import admission_key, pipeline_key, ready_key, server_metrics_key, store_key

STORE_CHECK_TIMEOUT_S = 2.0


def setup_ops_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[server_metrics_key].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """503 while starting, while shutting down, when a model worker has stopped (the process
    needs a restart), or when the conversation database does not answer (until it is back:
    the store reconnects by itself)."""
    app = request.app
    problems = []
    if not app[ready_key].is_set():
        problems.append("the pipeline is not running")
    elif not app[pipeline_key].workers_alive:
        problems.append("the model workers stopped (see the server log)")
    if app[admission_key].is_draining:
        problems.append("shutting down")
    try:
        await asyncio.wait_for(app[store_key].ping(), STORE_CHECK_TIMEOUT_S)
    except Exception:
        problems.append("the conversation database does not answer")
    admission = app[admission_key]
    body = {"status": "not ready" if problems else "ready", "problems": problems,
            "sessions": {"active": admission.num_reserved, "max": admission.max_sessions}}
    return web.json_response(body, status=503 if problems else 200)
