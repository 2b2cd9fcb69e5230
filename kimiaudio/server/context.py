"""The server's state, in one typed object: what every handler and session is built from.

`create_app` (app.py) builds one ServerContext and puts it under SERVER_CONTEXT; handlers read
it with `server_context(request)` (the /v1 sub-application's handlers too: aiohttp looks the
key up in the parent app). What starts and must stop is started by the app's cleanup contexts
(app.py), in this order, and set here as it starts: the conversation store, then the pipeline
(`ready` is set while it runs and the server is not stopping). Reading either before the app
has started is a bug, and says so. `answers` counts the /v1 answers being generated, which a
graceful shutdown waits for (serve.py's drain), as it waits for the sessions answering.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field

from aiohttp import web

from kimiaudio.config import Config
from kimiaudio.pipeline.model_stack import ModelStack
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.server.middleware.access import AccessPolicy
from kimiaudio.server.middleware.key_guesses import KeyGuesses
from kimiaudio.server.observe.server_metrics import ServerMetrics
from kimiaudio.server.session_registry import SessionRegistry
from kimiaudio.store import ConversationStore


class AnswersInFlight:
    """The /v1 answers whose pipeline turn runs (v1/turn_guard.py counts each for its turn's
    time): the drain waits until there are none, then `close()` cuts those left and no new one
    starts. Used on the event loop only."""

    def __init__(self) -> None:
        self._cuts: set[Callable[[], None]] = set()  # each running answer's cut
        self._none_running = asyncio.Event()
        self._none_running.set()
        self.is_closed = False

    def __len__(self) -> int:
        return len(self._cuts)

    @contextlib.contextmanager
    def counted(self, cut: Callable[[], None]) -> Iterator[None]:
        """Count one answer while the block runs; `close()` calls `cut` to end it early."""
        self._cuts.add(cut)
        self._none_running.clear()
        try:
            yield
        finally:
            self._cuts.discard(cut)
            if not self._cuts:
                self._none_running.set()

    async def none_running(self) -> None:
        await self._none_running.wait()

    def close(self) -> int:
        """Cut every answer still running (their turn_guard says so to their clients); how many."""
        self.is_closed = True
        cuts = list(self._cuts)
        for cut in cuts:
            cut()
        return len(cuts)


@dataclass(eq=False)
class ServerContext:
    config: Config
    stack: ModelStack | None  # None when the caller passed a pipeline it owns
    access: AccessPolicy
    sessions: SessionRegistry  # admission and the live real-time sessions
    metrics: ServerMetrics
    vad_executor: Executor  # the one thread running VAD inference
    ready: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    answers: AnswersInFlight = field(default_factory=AnswersInFlight, init=False)  # the /v1 answers running
    key_guesses: KeyGuesses = field(default_factory=KeyGuesses, init=False)  # wrong API keys by client
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
