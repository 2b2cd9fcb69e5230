"""The LM worker's speech encoding: which utterances the pending turns still need, the batch
being encoded, and the cache of recent results.

A batch runs a few encoder stages per LM worker iteration (audio/staged_work.py: the log-mels and
each transformer layer): while answers are being generated, about as long as the last engine
step took, so a newly committed turn holds the running answers back by about one step per
iteration, not by its whole encode; with nothing generating, the whole batch at once. A batch
that fails is split: each of its utterances is encoded alone, so one bad input fails only its
own turns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kimiaudio.audio.staged_work import Stages
from kimiaudio.pipeline.encode_cache import EncodeCache, Encoded
from kimiaudio.pipeline.lm_turn import LmTurn
from kimiaudio.pipeline.metrics import PipelineMetrics

log = logging.getLogger(__name__)

ENCODE_CACHE_SIZE = 512  # utterances whose (codes, features) stay cached for history reuse
MAX_IDLE_ENCODE_BATCH = 64  # when nothing is generating: one batch, but a bounded one


class EncodeJob:
    """One batch of utterances on its way through the encoders."""

    def __init__(self, keys: list[bytes], stages: Stages[list], clock: Callable[[], float] = time.perf_counter):
        self.keys = keys
        self.seconds = 0.0  # spent in its stages so far
        self._stages = stages
        self._clock = clock

    def advance(self, budget_s: float) -> list | None:
        """Run stages for at most about `budget_s` (at least one: the next stage is expected to
        last as long as the one before); the encoders' results once the last stage has run."""
        start = last = self._clock()
        try:
            while True:
                next(self._stages)
                now = self._clock()
                if now - start + (now - last) > budget_s:
                    return None
                last = now
        except StopIteration as done:
            return done.value
        finally:
            self.seconds += self._clock() - start

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
        self._job: EncodeJob | None = None
        self._alone: set[bytes] = set()  # utterances of a failed batch: each is encoded by itself

    @property
    def has_job(self) -> bool:
        return self._job is not None

    def advance(self, pending: list[LmTurn], busy: bool, budget_s: float) -> list[tuple[bytes, Exception]]:
        """Give the pending turns what the cache has, then run about `budget_s` of encoder stages
        (`busy`: answers are being generated). -> (utterance key, what failed) of each
        utterance that cannot be encoded: its turns must fail."""
        wanted = self._wanted(pending)
        if self._job is not None and not wanted.keys() & set(self._job.keys):
            self._job.drop()  # every turn that wanted it ended meanwhile (cancelled, failed)
            self._job = None
        if self._job is None:
            if not wanted:
                return []
            self._job = self._new_job(wanted, busy)
        job = self._job
        try:
            results = job.advance(budget_s)
        except Exception as exc:
            self._job = None
            if len(job.keys) > 1:
                log.warning("speech encoding of a batch of %d failed (%s); encoding one by one", len(job.keys), exc)
                self._alone.update(job.keys)
                return []
            self._alone.discard(job.keys[0])
            return [(job.keys[0], exc)]
        if results is None:
            return []
        self._job = None
        self.metrics.encode_batch_s.observe(job.seconds)
        self.metrics.note_batch("encode", len(job.keys))
        for key, (codes, features) in zip(job.keys, results):
            self._alone.discard(key)
            encoded: Encoded = (codes, features.cpu())
            self.cache.put(key, encoded)
            for turn in pending:
                if key in turn.audio:
                    turn.encoded[key] = encoded
        return []

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

    def _new_job(self, wanted: dict[bytes, object], busy: bool) -> EncodeJob:
        self._alone &= wanted.keys()  # the turns of the others ended meanwhile
        alone = [key for key in wanted if key in self._alone]
        keys = alone[:1] or list(wanted)[: self.batch_size if busy else MAX_IDLE_ENCODE_BATCH]
        return EncodeJob(keys, self.stack.encode_speech_stages([wanted[key] for key in keys]), self.clock)
