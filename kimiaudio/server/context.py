"""The server's state, in one typed object: what every handler and session is built from.

`create_app` (app.py) builds one ServerContext and puts it under SERVER_CONTEXT; handlers read
it with `server_context(request)` (the /v1 sub-application's handlers too: aiohttp looks the
key up in the parent app). What starts and must stop is started by the app's cleanup contexts
(app.py), in this order, and set here as it starts: the conversation store, then the pipeline
(`ready` is set while it runs and the server is not stopping). Reading either before the app
has started is a bug, and says so.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass, field

from aiohttp import web

from kimiaudio.config import Config
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.server.middleware.access import AccessPolicy
from kimiaudio.server.observe.server_metrics import ServerMetrics
from kimiaudio.server.session_registry import SessionRegistry
from kimiaudio.store import ConversationStore


@dataclass(eq=False)
class ServerContext:
    config: Config
    stack: ModelStack | None  # None when the caller passed a pipeline it owns
    access: AccessPolicy
    sessions: SessionRegistry  # admission and the live real-time sessions
    metrics: ServerMetrics
    vad_executor: Executor  # the one thread running VAD inference
    ready: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _store: ConversationStore | None = field(default=None, init=False, repr=False)
    _pipeline: Pipeline | None = field(default=None, init=False, repr=False)

    @property
    def store(self) -> ConversationStore:
        if self._store is None:
            raise RuntimeError("the conversation store opens when the app starts (app.py's cleanup contexts)")
        return self._store

    @store.setter
    def store(self, store: ConversationStore | None) -> None:
        self._store = store

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            raise RuntimeError("the pipeline starts when the app starts (app.py's cleanup contexts)")
        return self._pipeline

    @pipeline.setter
    def pipeline(self, pipeline: Pipeline | None) -> None:
        self._pipeline = pipeline

    def running_pipeline(self) -> Pipeline | None:
        """The pipeline once the app has started it (the metrics read it at scrape time)."""
        return self._pipeline


SERVER_CONTEXT = web.AppKey("server_context", ServerContext)


def server_context(request: web.Request) -> ServerContext:
    """The context of the app serving `request` (looked up through a sub-application's parents)."""
    return request.config_dict[SERVER_CONTEXT]
