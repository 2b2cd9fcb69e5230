"""A model worker: one thread that owns some device work, fed through an inbox.

The pipeline has two (docs/architecture.md, "Threads and CUDA streams"): the LM worker and the
detokenizer worker. Each runs `iterate()` in a loop on its own thread and, on CUDA, on its own
stream, so neither waits for the other's kernels; they meet only through each other's inbox.
Messages are posted from any thread (the event loop, the other worker) and handled on the
worker's thread in arrival order, so a worker's state has exactly one owner. A message is a
typed value (worker_messages.py), matched by its type, never by a tag.

A worker sleeps when `iterate()` reports no work and no message is waiting, until a message
arrives or the deadline `iterate()` asked for passes. An exception escaping a handler is
the worker's own bug: `on_error` is told (it fails the turns involved) and the loop goes on.
If the loop itself breaks (the device fails as the thread starts, or a BaseException), the
worker is dead: `on_died` fails every turn it holds, and every message still queued or
posted later is refused at once (`on_refused` fails its turn; a `call` future gets a
KimiAudioError), so no turn waits for a thread that is gone.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kimiaudio.errors import KimiAudioError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Call:
    """Run `fn` on the worker thread (`Worker.call`); handled by the base loop itself."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future


def configure_worker_thread(device: torch.device, threads: int) -> None:
    """The calling thread's torch settings for model work: engine.cpu_threads (0 = torch's
    default) on the CPU (torch's intra-op thread count is per thread: this sets the caller's
    alone); on cuda:N the current device, which is per thread too and which sdpa reads to
    pick its kernel."""
    if device.type == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    elif device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


# CUDA stream priorities (lower = more urgent; torch maps a value past the device's range to
# its end). The GPU's block scheduler starts waiting blocks of the more urgent stream first,
# so a worker given URGENT waits behind the other's kernels already running, not behind its
# whole queue (a detokenizer batch queues thousands).
URGENT, NORMAL = -1, 0


class Worker:
    def __init__(self, name: str, device: torch.device, cpu_threads: int, stream_priority: int = NORMAL):
        self.name = name
        self.device = device
        self._cpu_threads = cpu_threads
        self._stream_priority = stream_priority
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        # Set once the thread runs its loop (on its device and stream); the exception if it
        # could not get there.
        self.started: concurrent.futures.Future = concurrent.futures.Future()
        self._closed: str | None = None  # why messages are refused now (the loop has ended)
        self._post_lock = threading.Lock()  # a post lands in the inbox or is refused, never lost
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # ---- any thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def post(self, message: object) -> None:
        with self._post_lock:
            if self._closed is None:
                self._inbox.put(message)
                self._wake.set()
                return
        self._refuse(message, self._closed)

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the worker thread between iterations (work on state the worker owns, e.g.
        a voice's codes or prefix); its result or exception arrive in the future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.post(Call(fn, future))
        return future

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Finish the current iteration, run `on_stop` on the worker thread, and end it."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self._closed is None

    # ---- worker thread: subclasses fill these in -------------------------------------------
    def handle(self, message: object) -> None:
        raise NotImplementedError

    def iterate(self) -> float | None:
        """One round of work. Returns 0 to be called again at once, a number of seconds to
        sleep at most (a deadline of its own), or None to sleep until a message arrives."""
        return None

    def on_stop(self) -> None:
        """Once, on the worker thread, after the last iteration: end whatever is in flight."""

    def on_error(self, message: object | None, exc: Exception) -> None:
        """A handler or iterate() raised: contain it (fail the turns involved)."""

    def on_died(self, error: str) -> None:
        """The loop broke (on the worker thread, which runs nothing more): fail every turn held."""

    def on_refused(self, message: object, reason: str) -> None:
        """A message that will never be handled (on the posting thread): fail its turn, if it
        starts one; touch nothing but the message."""

    # ---- the loop ---------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the loop itself broke: say so loudly, end what it held
            log.critical("%s stopped unexpectedly", self.name, exc_info=True)
            error = f"the {self.name} worker stopped ({type(exc).__name__}: {exc}); restart the server"
            if not self.started.done():
                self.started.set_exception(exc)
            self._close_inbox(error)
            try:
                self.on_died(error)
            except Exception:
                log.exception("%s: ending its turns failed", self.name)
            return
        self._close_inbox("server shutting down")

    def _close_inbox(self, reason: str) -> None:
        """No message is handled from now on: the queued ones and any posted later are refused."""
        with self._post_lock:
            self._closed = reason
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._refuse(message, reason)

    def _refuse(self, message: object, reason: str) -> None:
        try:
            match message:
                case Call(future=future):
                    if future.set_running_or_notify_cancel():
                        future.set_exception(KimiAudioError(reason))
                case _:
                    self.on_refused(message, reason)
        except Exception:
            log.exception("%s: refusing a message failed", self.name)

    def _loop(self) -> None:
        configure_worker_thread(self.device, self._cpu_threads)
        if self.device.type == "cuda":
            # Its own stream: this worker's kernels never queue behind the other worker's. Weights
            # and pools were made on the default stream at load: wait for them once.
            torch.cuda.synchronize(self.device)
            torch.cuda.set_stream(torch.cuda.Stream(self.device, priority=self._stream_priority))
        self.started.set_result(None)
        while not self._stopping:
            self._wake.clear()
            self._drain()
            sleep = self._guard(None, self.iterate)
            if self._stopping or not self._inbox.empty() or sleep == 0:
                continue
            self._wake.wait(sleep if sleep is not None else None)
        self._drain()
        self._guard(None, self.on_stop)

    def _drain(self) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            match message:
                case Call(fn=fn, future=future):
                    _run_call(fn, future)
                case _:
                    self._guard(message, self.handle, message)

    def _guard(self, message: object | None, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            log.exception("%s: %s failed", self.name, getattr(fn, "__name__", fn))
            try:
                self.on_error(message, exc)
            except Exception:
                log.exception("%s: containing the failure failed", self.name)
            time.sleep(0.001)  # a failure repeating every iteration must not spin a core
            return 0


def _run_call(fn: Callable[[], Any], future: concurrent.futures.Future) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except BaseException as exc:  # the caller's to handle; the worker goes on
        future.set_exception(exc)
