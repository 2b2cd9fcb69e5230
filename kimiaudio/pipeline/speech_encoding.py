"""The LM worker's speech encoding: which utterances the pending turns still need, the batches
being encoded, and the cache of recent results.

Utterances are encoded in batches of at most `audio.encode_batch_size`, and each batch's
results go to its turns as soon as that batch ends, not when the burst it came in ends: the
first turns of 64 committed at once start generating while the rest are still being encoded.
A batch is a staged computation (audio/staged_work.py: the log-mels, each transformer layer).
The LM worker runs its stages for about as long as the last engine step took per iteration
while answers are being generated, so a new turn holds the running answers back by about one
step per iteration, not by its whole encode; with nothing generating, all of them at once.
After a batch's results are released the worker goes on to admit its turns before any more
encoder stages run.

On CUDA the stages run on a stream of their own, below the LM's priority: running a stage only
launches its kernels, and the GPU runs them beside the decode steps instead of queueing them in
front. A batch whose stages have all run is in flight: its outputs are copied to the host on
the encoder stream behind an event (audio/device_result.py), which the worker polls between
engine steps without waiting; its turns read host values only, so nothing on the LM's stream
waits for the encoder stream. At most MAX_BATCHES_IN_FLIGHT batches are in flight (one
computing while the next is launched). On the CPU a batch's results are ready when its last
stage has run.

A batch that fails is split: each of its utterances is encoded alone, so one bad input fails
only its own turns.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import torch

from kimiaudio.audio.device_result import DeviceResult, HostCopy
from kimiaudio.audio.staged_work import Stages
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.encode_cache import EncodeCache, Encoded
from kimiaudio.pipeline.lm_turn import LmTurn
from kimiaudio.pipeline.metrics import PipelineMetrics
from kimiaudio.pipeline.worker import NORMAL

log = logging.getLogger(__name__)

ENCODE_CACHE_SIZE = 512  # utterances whose (codes, features) stay cached for history reuse
MAX_BATCHES_IN_FLIGHT = 2  # CUDA: batches launched whose results are not back yet


class EncodeJob:
    """One batch of utterances on its way through the encoders."""

    host_copy = HostCopy  # how its results reach the host (a test may swap in a stand-in)

    def __init__(
        self,
        keys: list[bytes],
        stages: Stages[DeviceResult[list]],
        clock: Callable[[], float] = time.perf_counter,
        stream: torch.cuda.Stream | None = None,
    ):
        self.keys = keys
        self.seconds = 0.0  # spent running its stages so far (on CUDA: launching their kernels)
        self.started = clock()
        self.num_stages = 0  # stages run by the last `advance`
        self._stages = stages
        self._clock = clock
        self._stream = stream
        self._copy: HostCopy | None = None  # once every stage has run: its results on their way

    @property
    def launched(self) -> bool:
        """Every stage has run (on CUDA its kernels may still be running)."""
        return self._copy is not None

    def advance(self, budget_s: float) -> bool:
        """Run stages for at most about `budget_s` (at least one: the next stage is expected to
        last as long as the one before); True once the last one has run."""
        start = last = self._clock()
        self.num_stages = 0
        context = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        try:
            with context:
                while True:
                    self.num_stages += 1
                    try:
                        next(self._stages)
                    except StopIteration as done:
                        self._copy = self.host_copy(done.value)  # on the encoder stream, behind its kernels
                        return True
                    now = self._clock()
                    if now - start + (now - last) > budget_s:
                        return False
                    last = now
        finally:
            self.seconds += self._clock() - start

    def ready(self) -> bool:
        """Its results are on the host (never waits)."""
        return self._copy is not None and self._copy.ready()

    def results(self) -> list[Encoded]:
        """(codes, host features) per key, once `ready`."""
        if self._copy is None:
            raise KimiAudioError("speech encoding: no batch's results to take")
        return self._copy.value()

    def drop(self) -> None:
        """Give up on the batch: its generator and the tensors it holds go now."""
        self._stages.close()


class SpeechEncoding:
    def __init__(
        self, stack, batch_size: int, metrics: PipelineMetrics, clock: Callable[[], float] = time.perf_counter
    ):
        self.stack, self.batch_size, self.metrics = stack, batch_size, metrics
        self.clock = clock  # times each batch's stages against its budget (tests inject one)
        self.cache = EncodeCache(ENCODE_CACHE_SIZE)
        self.num_stages = 0  # encoder stages run by the last `advance` (the LM step's tags)
        self._launching: EncodeJob | None = None  # the batch whose stages are being run
        self._in_flight: list[EncodeJob] = []  # launched, oldest first: their results come back in order
        self._alone: set[bytes] = set()  # utterances of a failed batch: each is encoded by itself
        self._stream: torch.cuda.Stream | None = None

    @property
    def has_job(self) -> bool:
        return self._launching is not None or bool(self._in_flight)

    @property
    def on_device(self) -> bool:
        """A launched batch's work may still be running on the device (CUDA only)."""
        return bool(self._in_flight)

    def advance(self, pending: list[LmTurn], budget_s: float) -> list[tuple[bytes, Exception]]:
        """Give the pending turns what the cache has and what batches have finished; if none
        finished, run about `budget_s` of encoder stages. -> (utterance key, what failed) of
        each utterance that cannot be encoded: its turns must fail."""
        self.num_stages = 0
        failures: list[tuple[bytes, Exception]] = []
        if self._release_finished(pending, failures):
            return failures  # its turns start before more encoder work is launched
        wanted = self._wanted(pending)
        if self._launching is not None and not wanted.keys() & set(self._launching.keys):
            self._launching.drop()  # every turn that wanted it ended meanwhile (cancelled, failed)
            self._launching = None
        if self._launching is None:
            if len(self._in_flight) >= MAX_BATCHES_IN_FLIGHT:
                return failures
            in_flight = {key for job in self._in_flight for key in job.keys}
            candidates = {key: pcm for key, pcm in wanted.items() if key not in in_flight}
            if not candidates:
                return failures
            self._alone &= wanted.keys()  # the turns of the others ended meanwhile
            self._launching = self._new_job(candidates)
        job = self._launching
        try:
            launched = job.advance(budget_s)
        except Exception as exc:
            self._launching = None
            failures += self._failed(job, exc)
            return failures
        finally:
            self.num_stages = job.num_stages
        if launched:
            self._launching = None
            self._in_flight.append(job)
            self._release_finished(pending, failures)  # on the CPU its results are there now
        return failures

    def _release_finished(self, pending: list[LmTurn], failures: list) -> bool:
        """Hand the results of every finished batch to the turns and the cache; True if any."""
        released = False
        while self._in_flight and self._in_flight[0].ready():
            job = self._in_flight.pop(0)
            try:
                results = job.results()
            except Exception as exc:
                failures += self._failed(job, exc)
                continue
            self.metrics.encode_batch_s.observe(self.clock() - job.started)
            self.metrics.note_batch("encode", len(job.keys))
            for key, encoded in zip(job.keys, results):
                self._alone.discard(key)
                self.cache.put(key, encoded)
                for turn in pending:
                    if key in turn.audio:
                        turn.encoded[key] = encoded
            released = True
        return released

    def _failed(self, job: EncodeJob, exc: Exception) -> list[tuple[bytes, Exception]]:
        if len(job.keys) > 1:
            log.warning("speech encoding of a batch of %d failed (%s); encoding one by one", len(job.keys), exc)
            self._alone.update(job.keys)
            return []
        self._alone.discard(job.keys[0])
        return [(job.keys[0], exc)]

    def _wanted(self, pending: list[LmTurn]) -> dict[bytes, object]:
        """The utterances no pending turn has yet and the cache does not hold: key -> pcm."""
        wanted: dict[bytes, object] = {}
        for turn in pending:
            for key in turn.missing:
                hit = self.cache.get(key)
                if hit is not None:
                    turn.encoded[key] = hit
                else:
                    wanted.setdefault(key, turn.audio[key])
        return wanted

    def _new_job(self, candidates: dict[bytes, object]) -> EncodeJob:
        alone = [key for key in candidates if key in self._alone]
        keys = alone[:1] or list(candidates)[: self.batch_size]
        stages = self.stack.encode_speech_stages([candidates[key] for key in keys])  # runs nothing yet
        return EncodeJob(keys, stages, self.clock, self._encoder_stream())

    def _encoder_stream(self) -> torch.cuda.Stream | None:
        """The encoders' CUDA stream (made on first use, on the LM worker's thread); None elsewhere."""
        device = getattr(self.stack, "device", None)
        if self._stream is None and device is not None and device.type == "cuda":
            self._stream = torch.cuda.Stream(device, priority=NORMAL)
        return self._stream
