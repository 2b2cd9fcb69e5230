"""The aiohttp application: its factory and the lifetime of its parts (serve.py runs it).

`create_app(config, stack, pipeline=None)` builds the app with typed AppKeys (no module
globals). Things that start and must stop are cleanup contexts: the conversation store (its
writer/reader threads) and, unless the caller passes one it owns, the pipeline (the GPU
worker). `on_shutdown` closes every peer connection first, so interrupted turns are stored
before the store and the pipeline go away.

Every request passes the same middlewares, outermost first: one log line per /v1 request
(observe/request_log.py), errors as JSON (error_middleware.py),
Host / API key / Origin (access.py), no new work while shutting down (admission.py), body size
and read deadline (request_body.py).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from kimiaudio.audio.vad import vad_executor
from kimiaudio.config import Config
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.server.app_keys import (
    access_key,
    admission_key,
    body_timeout_key,
    config_key,
    max_body_bytes_key,
    pipeline_key,
    ready_key,
    server_metrics_key,
    sessions_key,
    stack_key,
    store_key,
    vad_executor_key,
)
from kimiaudio.server.middleware.access import AccessPolicy, access_middleware
from kimiaudio.server.middleware.admission import Admission, draining_middleware
from kimiaudio.server.middleware.error_middleware import error_middleware
from kimiaudio.server.middleware.request_body import body_limits_middleware
from kimiaudio.server.observe.instance_label import instance_id
from kimiaudio.server.observe.log_setup import filter_client_faults
from kimiaudio.server.observe.request_log import request_log_middleware
from kimiaudio.server.observe.server_metrics import ServerMetrics
from kimiaudio.server.ops_routes import setup_ops_routes
from kimiaudio.server.routes import setup_routes
from kimiaudio.store import ConversationStore, database_location

log = logging.getLogger(__name__)


def create_app(config: Config, stack: ModelStack | None, pipeline: Pipeline | None = None) -> web.Application:
    """The server app. A `pipeline` passed in is used as it is (the caller starts and stops it)."""
    if stack is None and pipeline is None:
        raise KimiAudioError("create_app needs a model stack or a pipeline")
    filter_client_faults()
    admission = Admission(config.server.max_sessions)
    policy = AccessPolicy.from_config(config)
    app = web.Application(client_max_size=config.server.max_body_bytes)
    metrics = ServerMetrics(
        lambda: app.get(pipeline_key),
        lambda: admission.num_reserved,
        instance_id(config.server.instance_id, config.server.port),
    )
    app.middlewares.extend(
        [
            request_log_middleware,
            error_middleware(metrics),
            access_middleware(policy),
            draining_middleware(admission),
            body_limits_middleware,
        ]
    )
    app[config_key] = config
    app[stack_key] = stack
    app[sessions_key] = {}
    app[admission_key] = admission
    app[access_key] = policy
    app[max_body_bytes_key] = config.server.max_body_bytes
    app[body_timeout_key] = config.server.body_timeout_s
    app[ready_key] = asyncio.Event()
    app[server_metrics_key] = metrics
    app.cleanup_ctx.append(_store_context)
    app.cleanup_ctx.append(_vad_context)
    app.cleanup_ctx.append(_pipeline_context(pipeline))
    app.on_shutdown.append(_close_sessions)
    setup_routes(app)
    setup_ops_routes(app)
    return app


async def _store_context(app: web.Application):
    config = app[config_key]
    store = ConversationStore(database_location(config), lease_seconds=config.storage.lease_seconds)
    await store.open()
    app[store_key] = store
    yield
    await store.close()


async def _vad_context(app: web.Application):
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
