"""The model worker's loop (pipeline/worker.py) when the loop itself breaks: what it held is
ended by `on_died`, and every message queued or posted later is refused, none lost."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
import torch

from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.worker import Worker

from helpers.worker_faults import Broken


@dataclass(frozen=True)
class Hold:
    number: int


@dataclass(frozen=True)
class Gate:
    """Holds the loop until the test opens the gate."""


@dataclass(frozen=True)
class Die:
    """Breaks the loop itself."""


class Recorder(Worker):
    def __init__(self):
        super().__init__("recorder", torch.device("cpu"), 0)
        self.gate = threading.Event()
        self.held: list[int] = []
        self.died: list[tuple[str, list[int]]] = []
        self.refused: list[tuple[object, str, str]] = []

    def handle(self, message: object) -> None:
        match message:
            case Hold(number=number):
                self.held.append(number)
            case Gate():
                assert self.gate.wait(10)
            case Die():
                raise Broken("injected")

    def on_died(self, error: str) -> None:
        self.died.append((error, list(self.held)))

    def on_refused(self, message: object, reason: str) -> None:
        self.refused.append((message, reason, threading.current_thread().name))


def wait_dead(worker: Worker) -> None:
    deadline = time.monotonic() + 120  # catches a hang: a loaded machine may be slow to end the thread
    while worker.is_alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not worker.is_alive


def test_a_broken_loop_ends_what_it_held_and_refuses_every_later_message():
    worker = Recorder()
    worker.start()
    assert worker.started.result(timeout=120) is None
    worker.post(Hold(1))
    worker.post(Gate())  # holds the loop while the messages behind it queue up
    worker.post(Die())
    worker.post(Hold(2))
    future = worker.call(lambda: "never run")
    worker.gate.set()
    wait_dead(worker)
    worker.post(Hold(3))  # after its end: refused at once, on the posting thread
    [(error, held)] = worker.died
    assert "recorder worker stopped (Broken: injected)" in error and held == [1]
    assert [(m, r) for m, r, _ in worker.refused] == [(Hold(2), error), (Hold(3), error)]
    assert worker.refused[1][2] == threading.current_thread().name
    with pytest.raises(KimiAudioError, match="recorder worker stopped"):
        future.result(timeout=120)  # failed already: the limit catches a hang
    assert worker.held == [1]


def test_a_worker_that_cannot_take_up_its_device_says_so_in_started(monkeypatch):
    def no_device(device, threads):
        raise RuntimeError("injected: no such device")

    monkeypatch.setattr("kimiaudio.pipeline.worker.configure_worker_thread", no_device)
    worker = Recorder()
    worker.start()
    with pytest.raises(RuntimeError, match="no such device"):
        worker.started.result(timeout=120)
    wait_dead(worker)
    worker.post(Hold(1))
    assert worker.held == [] and [m for m, _, _ in worker.refused] == [Hold(1)]


def test_a_stopped_worker_refuses_what_comes_after_its_last_drain():
    worker = Recorder()
    worker.start()
    worker.post(Hold(1))
    worker.stop(timeout=120)
    worker.post(Hold(2))
    assert worker.held == [1] and worker.died == []
    assert [(m, r) for m, r, _ in worker.refused] == [(Hold(2), "server shutting down")]
