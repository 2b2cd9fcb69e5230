"""Every typed key of the aiohttp app's state, in one place (aiohttp's AppKey).

`app.create_app` fills them; routes and middlewares read them. This module imports only the
types of what the keys hold, so any server module may import it without forming a cycle
(the access and draining middlewares get their state when the app is built instead).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from aiohttp import web

from kimiaudio.config import Config
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.server.middleware.access import AccessPolicy
from kimiaudio.server.middleware.admission import Admission
from kimiaudio.server.observe.server_metrics import ServerMetrics
from kimiaudio.store import ConversationStore

config_key = web.AppKey("config", Config)
stack_key = web.AppKey("stack", ModelStack)  # None when the caller passed a pipeline it owns
pipeline_key = web.AppKey("pipeline", Pipeline)
store_key = web.AppKey("store", ConversationStore)
# session id -> a live session (any transport's: it has `is_answering` and `close()`)
sessions_key = web.AppKey("sessions", dict)
ready_key = web.AppKey("ready", asyncio.Event)  # set while the pipeline runs and the server is not stopping
vad_executor_key = web.AppKey("vad_executor", Executor)  # the one thread running VAD inference
access_key = web.AppKey("access", AccessPolicy)
admission_key = web.AppKey("admission", Admission)
server_metrics_key = web.AppKey("server_metrics", ServerMetrics)
max_body_bytes_key = web.AppKey("max_body_bytes", int)
body_timeout_key = web.AppKey("body_timeout_s", float)
