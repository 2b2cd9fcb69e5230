"""The aiohttp application: its factory and the lifetime of its parts (serve.py runs it).

`create_app(config, stack, pipeline=None)` builds the app with typed AppKeys (no module
globals). Things that start and must stop are cleanup contexts: the conversation store (its
writer/reader threads) and, unless the caller passes one it owns, the pipeline (the GPU
worker). `on_shutdown` closes every peer connection first, so interrupted turns are stored
before the store and the pipeline go away.

Every request passes the same middlewares, outermost first: errors as JSON (api_error.py),
Host / API key / Origin (access.py), no new work while shutting down (admission.py), body size
and read deadline (request_body.py).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Any

from aiohttp import web

from kimiaudio.config import Config
from kimiaudio.errors import KimiAudioError
from kimiaudio.server.gate.access import AccessPolicy, access_key, access_middleware
from kimiaudio.server.gate.admission import Admission, admission_key, draining_middleware
from kimiaudio.server.gate.api_error import error_middleware
from kimiaudio.server.gate.request_body import body_limits_middleware, body_timeout_key, max_body_bytes_key
from kimiaudio.server.observe.log_setup import filter_client_faults
from kimiaudio.server.observe.server_metrics import ServerMetrics, server_metrics_key
from kimiaudio.store import ConversationStore

log = logging.getLogger(__name__)

config_key = web.AppKey("config", Config)
stack_key = web.AppKey("stack", Any)  # ModelStack | None
pipeline_key = web.AppKey("pipeline", Any)  # Pipeline
store_key = web.AppKey("store", ConversationStore)
# session id -> a live session (RtcSession; any transport's: it has `is_answering` and `close()`)
sessions_key = web.AppKey("sessions", dict)
ready_key = web.AppKey("ready", asyncio.Event)  # set while the pipeline runs and the server is not stopping
vad_executor_key = web.AppKey("vad_executor", Executor)  # the one thread running VAD inference


def create_app(config: Config, stack, pipeline=None) -> web.Application:
    """The server app. A `pipeline` passed in is used as it is (the caller starts and stops it)."""
    from kimiaudio.server.ops_routes import setup_ops_routes
    from kimiaudio.server.routes import setup_routes

    if stack is None and pipeline is None:
        raise KimiAudioError("create_app needs a model stack or a pipeline")
    filter_client_faults()
    middlewares = [error_middleware, access_middleware, draining_middleware, body_limits_middleware]
    app = web.Application(middlewares=middlewares, client_max_size=config.server.max_body_bytes)
    app[config_key] = config
    app[stack_key] = stack
    app[sessions_key] = {}
    app[admission_key] = Admission(config.server.max_sessions)
    app[access_key] = AccessPolicy.from_config(config)
    app[max_body_bytes_key] = config.server.max_body_bytes
    app[body_timeout_key] = config.server.body_timeout_s
    app[ready_key] = asyncio.Event()
    app[server_metrics_key] = ServerMetrics(lambda: app.get(pipeline_key), lambda: app[admission_key].num_reserved)
    app.cleanup_ctx.append(_store_context)
    app.cleanup_ctx.append(_vad_context)
    app.cleanup_ctx.append(_pipeline_context(pipeline))
    app.on_shutdown.append(_close_sessions)
    setup_routes(app)
    setup_ops_routes(app)
    return app


async def _store_context(app: web.Application):
    config = app[config_key]
    store = ConversationStore(config.data_dir / config.storage.database)
    await store.open()
    app[store_key] = store
    yield
    await store.close()


async def _vad_context(app: web.Application):
    from kimiaudio.audio.vad import vad_executor

    app[vad_executor_key] = executor = vad_executor()
    yield
    executor.shutdown(wait=True)


def _pipeline_context(pipeline):
    async def context(app: web.Application):
        if pipeline is not None:
            app[pipeline_key] = pipeline
            app[ready_key].set()
            yield
            app[ready_key].clear()
            return
        from kimiaudio.pipeline.pipeline import Pipeline

        owned = Pipeline(app[stack_key], app[config_key])
        await owned.start()
        app[pipeline_key] = owned
        app[ready_key].set()
        yield
        app[ready_key].clear()
        await owned.stop()

    return context


async def _close_sessions(app: web.Application) -> None:
    app[admission_key].is_draining = True
    await asyncio.gather(*(s.close() for s in list(app[sessions_key].values())), return_exceptions=True)
    app[sessions_key].clear()
