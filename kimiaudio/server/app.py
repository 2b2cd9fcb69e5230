"""The aiohttp application: its factory and the lifetime of its parts (serve.py runs it).

`create_app(config, stack, pipeline=None)` builds the app and its one ServerContext
(context.py), under SERVER_CONTEXT: no module globals, no other app state. Things that start
and must stop are cleanup contexts, all added here, in the order they start (and the reverse
of the order they stop): the conversation store (its writer/reader threads), the VAD thread,
the pipeline (the GPU workers; unless the caller passes one it owns), the stored voices'
registration, the voices' sync between instances, the calls' directory (a hang-up reaching
any instance; where WebRTC is available: transport/webrtc.py). `on_shutdown` closes every
session first, so interrupted turns are stored before the store and the pipeline go away.

Every request passes the app's middlewares, outermost first: cross-origin answers for the
allowed origins (middleware/cors.py), errors as JSON (middleware/error_responses.py), Host /
API key / Origin (access.py), no new work while shutting down (draining.py), body size and
read deadline (body_limits.py). The OpenAI API is a sub-application mounted at /v1
(v1/api.py) with its own: a log line per request, then the same error mapping. The other
routes are grouped by what they serve (routes/).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from kimiaudio.audio.vad import vad_executor
from kimiaudio.config import Config
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.server.context import SERVER_CONTEXT, ServerContext
from kimiaudio.server.middleware.access import AccessPolicy, access_middleware
from kimiaudio.server.middleware.body_limits import body_limits_middleware
from kimiaudio.server.middleware.cors import cors_headers, cors_middleware
from kimiaudio.server.middleware.draining import draining_middleware
from kimiaudio.server.middleware.error_responses import error_middleware
from kimiaudio.server.observe.log_setup import filter_client_faults
from kimiaudio.server.observe.server_metrics import ServerMetrics, instance_id
from kimiaudio.server.routes import conversations, ops, page, rtc_offer, signin, voices
from kimiaudio.server.session_registry import SessionRegistry
from kimiaudio.server.stored_voices import registered_voices, voice_sync
from kimiaudio.server.transport import webrtc
from kimiaudio.server.v1.api import create_v1_app
from kimiaudio.store import ConversationStore, database_location


def create_app(config: Config, stack: ModelStack | None, pipeline: Pipeline | None = None) -> web.Application:
    """The server app. A `pipeline` passed in is used as it is (the caller starts and stops it)."""
    if stack is None and pipeline is None:
        raise KimiAudioError("create_app needs a model stack or a pipeline")
    filter_client_faults()
    context = new_context(config, stack)
    server = config.server
    app = web.Application(client_max_size=server.max_body_bytes)
    app.middlewares.extend(
        [
            cors_middleware(context.access),
            error_middleware(context.metrics),
            access_middleware(context.access, lambda: context.store, context.key_guesses),
            draining_middleware(lambda: context.sessions.is_draining),
            body_limits_middleware(server.max_body_bytes, server.body_timeout_s),
        ]
    )
    app.on_response_prepare.append(cors_headers(context.access))
    app[SERVER_CONTEXT] = context
    app.cleanup_ctx.extend([_store_context, _vad_context, _pipeline_context(pipeline), registered_voices, voice_sync])
    if webrtc.MISSING is None:
        app.cleanup_ctx.append(webrtc.call_directory)
    app.on_shutdown.append(_close_sessions)
    for group in (page, signin, rtc_offer, conversations, voices, ops):
        app.add_routes(group.routes)
    webrtc.warn_if_missing()
    app.add_subapp("/v1", create_v1_app(server.max_body_bytes))
    return app


def new_context(config: Config, stack: ModelStack | None) -> ServerContext:
    """The context of a new app: its parts built, none started (the cleanup contexts start them)."""
    server = config.server
    sessions: SessionRegistry | None = None
    context: ServerContext | None = None
    metrics = ServerMetrics(
        lambda: context.running_pipeline() if context is not None else None,
        lambda: sessions.num_reserved if sessions is not None else 0,
        instance_id(server.instance_id, server.port),
    )
    executor = vad_executor()  # its one thread starts with the first VAD call
    sessions = SessionRegistry(server.max_sessions, metrics, executor)
    context = ServerContext(config, stack, AccessPolicy.from_config(config), sessions, metrics, executor)
    return context


async def _store_context(app: web.Application) -> AsyncIterator[None]:
    context = app[SERVER_CONTEXT]
    config = context.config
    store = ConversationStore(database_location(config), lease_seconds=config.storage.lease_seconds)
    await store.open()
    context.store = store
    yield
    await store.close()


async def _vad_context(app: web.Application) -> AsyncIterator[None]:
    yield
    app[SERVER_CONTEXT].vad_executor.shutdown(wait=True)


def _pipeline_context(pipeline: Pipeline | None):
    async def running_pipeline(app: web.Application) -> AsyncIterator[None]:
        context = app[SERVER_CONTEXT]
        owned = None
        if pipeline is None:
            if context.stack is None:
                raise KimiAudioError("create_app needs a model stack or a pipeline")
            owned = Pipeline(context.stack, context.config)
            await owned.start()
        context.pipeline = pipeline or owned
        context.ready.set()
        yield
        context.ready.clear()
        if owned is not None:
            await owned.stop()

    return running_pipeline


async def _close_sessions(app: web.Application) -> None:
    await app[SERVER_CONTEXT].sessions.close_all()
