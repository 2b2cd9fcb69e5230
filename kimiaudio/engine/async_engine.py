"""The engine on its own worker thread, fed from and streaming back to an asyncio loop.

One worker thread owns the LLMEngine (and whatever the hooks touch, e.g. speech encoders and
the detokenizer). Each iteration: apply submitted requests and aborts, run `before_step()`,
one `LLMEngine.step()` if there is work, deliver its outputs, run `after_step(outputs)`.
With nothing to do it sleeps on a threading.Event that `submit`, `abort` and `wake` set.
The loop side never blocks on the worker: `submit` and `abort` only enqueue, and outputs
arrive through `loop.call_soon_threadsafe` into each handle's asyncio.Queue.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Callable

from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.request import EngineRequest, StepOutput
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.event_stream import EventStream

log = logging.getLogger(__name__)


class RequestHandle(EventStream[StepOutput]):
    """Async iterator of one request's StepOutputs; it ends after the one with finished=True."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop):
        super().__init__(loop, lambda output: output.finished)
        self.request_id = request_id
        self.seq_id: int | None = None  # set by the worker once the engine accepted it
        self.aborted = False


Hook = Callable[..., object]


class AsyncEngine:
    def __init__(self, engine: LLMEngine, before_step: Hook | None = None, after_step: Hook | None = None,
                 name: str = "kimiaudio-engine", on_start: Hook | None = None):
        """before_step() and after_step(outputs) run on the worker thread every iteration; a
        truthy return value means "I have more work", which keeps the worker from sleeping.
        on_start() runs once on the worker thread before the first iteration (thread settings)."""
        self.engine = engine
        self.on_start = on_start
        self.before_step = before_step
        self.after_step = after_step
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._handles: dict[int, RequestHandle] = {}  # worker thread only
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest, loop: asyncio.AbstractEventLoop | None = None) -> RequestHandle:
        """Queue a request; iterate the handle for its outputs. From the loop or any thread
        (then pass the loop the outputs are for)."""
        handle = RequestHandle(request.request_id, loop or asyncio.get_running_loop())
        if self._stopping:
            self._send(handle, StepOutput(request.request_id, -1, None, None, True, "error", "engine stopped"))
            return handle
        self._inbox.put(("add", handle, request))
        self._wake.set()
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """End the handle now (a final output with finish_reason "abort"); the worker frees
        the request's KV blocks before its next step."""
        handle.aborted = True
        self._send(handle, StepOutput(handle.request_id, -1 if handle.seq_id is None else handle.seq_id,
                                      None, None, True, "abort"))
        self._inbox.put(("abort", handle, None))
        self._wake.set()

    def wake(self) -> None:
        """Make the worker run an iteration (e.g. after a hook's own queue got work)."""
        self._wake.set()

    def stats(self):
        return self.engine.stats()  # plain counters; a read racing a step may be one step old

    def stop(self, timeout: float | None = None) -> None:
        """Stop the worker after its current iteration; live requests end with an error."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        self._call_hook(self.on_start)
        while not self._stopping:
            self._wake.clear()
            self._drain_inbox()
            busy = self._call_hook(self.before_step)
            self._drain_inbox()  # the hook may have submitted requests
            outputs: list[StepOutput] = []
            if self.engine.has_work():
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # bookkeeping bug: end every live request, keep serving
                    log.exception("engine step raised")
                    self._fail_all(f"engine error: {type(exc).__name__}: {exc}")
            for output in outputs:
                self._publish(output)
            busy = self._call_hook(self.after_step, outputs) or busy
            if not (busy or self.engine.has_work() or not self._inbox.empty()):
                self._wake.wait()
        self._drain_inbox()
        self._fail_all("engine stopped")

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, handle, request = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "abort":
                if handle.seq_id is not None and self._handles.pop(handle.seq_id, None) is not None:
                    self.engine.abort(handle.seq_id)
            elif not handle.aborted:
                self._add(handle, request)

    def _add(self, handle: RequestHandle, request: EngineRequest) -> None:
        try:
            handle.seq_id = self.engine.add_request(request)
        except KimiAudioError as exc:
            self._send(handle, StepOutput(request.request_id, -1, None, None, True, "error", str(exc)))
            return
        self._handles[handle.seq_id] = handle

    def _publish(self, output: StepOutput) -> None:
        handle = self._handles.get(output.seq_id)
        if handle is None:
            return  # aborted meanwhile
        if output.finished:
            del self._handles[output.seq_id]
        if not self._send(handle, output) and not output.finished:
            del self._handles[output.seq_id]  # its loop is gone: nobody will read the rest
            self.engine.abort(output.seq_id)

    def _send(self, handle: RequestHandle, output: StepOutput) -> bool:
        return handle.deliver(output)  # False: the handle's event loop is closed

    def _fail_all(self, error: str) -> None:
        for seq_id, handle in list(self._handles.items()):
            self.engine.abort(seq_id)
            self._send(handle, StepOutput(handle.request_id, seq_id, None, None, True, "error", error))
        self._handles.clear()

    def _call_hook(self, hook: Hook | None, *args) -> bool:
        if hook is None:
            return False
        try:
            return bool(hook(*args))
        except Exception:
            log.exception("engine hook %s raised", getattr(hook, "__name__", hook))
            return False
