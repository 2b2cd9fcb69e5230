"""Voice activity detection and turn detection for the real-time server.

`SileroVad` wraps the silero VAD model from the silero-vad package: one speech probability
per 512-sample window at 16 kHz (32 ms), with the model's recurrent state kept per stream,
so every session owns its own instance. `TurnDetector` is the state machine on top of it
(both run on the one thread of `vad_executor()`):

    silence --p>=threshold--> pending --speech for min_speech_ms--> speaking
    pending --silence_ms of silence--> silence (too short: a click, a cough)
    speaking --silence_ms of silence (or max_speech_s of audio)--> silence, emitting SpeechStopped

It follows silero's own VADIterator hysteresis: a window counts as speech at p >= threshold
and as silence only below threshold - 0.15; in between it continues whatever it continues.
SpeechStopped carries the utterance with `prefix_padding_ms` of audio before the onset and at
most as much of the trailing silence, so word edges are not clipped. An utterance is cut when
that audio, its padding included, reaches max_speech_s (the server's limit on one spoken turn,
which refuses anything longer): the speech that goes on is the next utterance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kimiaudio.audio.rates import SPEECH_INPUT_RATE

WINDOW = 512  # samples per silero window at 16 kHz (32 ms)
_HYSTERESIS = 0.15


def _load_silero_model():
    import torch

    # Importing silero_vad calls torch.set_num_threads(1) for the whole process; a library
    # must not change that, so put back what was there.
    threads = torch.get_num_threads()
    try:
        from silero_vad import load_silero_vad

        return load_silero_vad()
    finally:
        torch.set_num_threads(threads)


def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)  # per thread: only this executor's thread is affected


def vad_executor() -> ThreadPoolExecutor:
    """The thread that runs VAD inference for every session (callers shut it down).

    The model is tiny (about 0.2 ms per window on one core); with several intra-op threads it
    gets slower, and the spinning pool threads steal CPU from the event loop and the GPU
    worker. So VAD runs here, off the event loop, with one torch thread.
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="kimiaudio-vad", initializer=_one_torch_thread)


class SileroVad:
    """Speech probability of consecutive 512-sample windows of one 16 kHz stream."""

    def __init__(self, model=None):
        self._model = model if model is not None else _load_silero_model()
        self._model.reset_states()

    def __call__(self, window: np.ndarray) -> float:
        import torch

        with torch.inference_mode():
            return float(
                self._model(torch.from_numpy(np.ascontiguousarray(window, dtype=np.float32)), SPEECH_INPUT_RATE)
            )

    def reset(self) -> None:
        self._model.reset_states()

    def max_speech_probability(self, pcm: np.ndarray) -> float:
        """The highest speech probability over a whole 16 kHz clip's windows (the last one
        zero-padded), from a fresh state: 1 minus it is how likely the clip holds no speech."""
        self.reset()
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        padded = np.pad(pcm, (0, -pcm.size % WINDOW))
        best = max((self(padded[i : i + WINDOW]) for i in range(0, padded.size, WINDOW)), default=0.0)
        self.reset()
        return best


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int  # stream time of the onset (without padding)


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int  # stream time at which the end of speech was decided
    audio: np.ndarray  # float32 16 kHz: padding + utterance + at most padding of trailing silence


TurnEvent = SpeechStarted | SpeechStopped


@dataclass
class TurnSettings:
    threshold: float = 0.5
    min_speech_ms: int = 250
    silence_ms: int = 500
    prefix_padding_ms: int = 300
    max_speech_s: float = 120.0  # the longest utterance's audio, its padding included


def _windows(ms: float) -> int:
    return max(1, int(round(ms * SPEECH_INPUT_RATE / 1000 / WINDOW)))


class TurnDetector:
    """Feed 16 kHz float32 audio of any chunk size; get SpeechStarted / SpeechStopped events."""

    def __init__(self, vad: Callable[[np.ndarray], float], settings: TurnSettings | None = None):
        self._vad = vad
        self._pending = np.zeros(0, dtype=np.float32)  # samples not yet making a full window
        self._num_windows = 0  # windows processed since creation (the stream clock)
        self._before: deque[np.ndarray] = deque(maxlen=1)  # the last windows before an onset: the prefix padding
        self.configure(settings or TurnSettings())
        self.reset()

    def configure(self, settings: TurnSettings) -> None:
        """Change the settings (session.update); the current state is kept."""
        self.settings = settings
        self._padding_windows = max(0, int(round(settings.prefix_padding_ms * SPEECH_INPUT_RATE / 1000 / WINDOW)))
        self._min_speech_windows = _windows(settings.min_speech_ms)
        self._silence_windows = _windows(settings.silence_ms)
        # Rounded down: the utterance cut at the limit must not pass it.
        self._max_windows = max(1, int(settings.max_speech_s * SPEECH_INPUT_RATE) // WINDOW)
        self._before = deque(self._before, maxlen=self._padding_windows or 1)

    def reset(self) -> None:
        """Forget any utterance in progress (e.g. input ignored while the assistant speaks)."""
        self.state = "silence"
        self._before.clear()  # the last windows before an onset: the prefix padding
        self._utterance: list[np.ndarray] = []  # windows from the onset on
        self._num_speech = 0  # windows at or above the threshold in this utterance
        self._silence_run = 0  # trailing windows counted as silence
        self._onset = 0  # window index of the onset
        if hasattr(self._vad, "reset"):
            self._vad.reset()

    @property
    def is_speaking(self) -> bool:
        return self.state == "speaking"

    def push(self, pcm: np.ndarray) -> list[TurnEvent]:
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        data = np.concatenate([self._pending, pcm]) if self._pending.size else pcm
        events: list[TurnEvent] = []
        num_full = data.size // WINDOW
        for i in range(num_full):
            event = self._step(data[i * WINDOW : (i + 1) * WINDOW])
            if event is not None:
                events.append(event)
        self._pending = data[num_full * WINDOW :].copy()
        return events

    def _ms(self, window_index: int) -> int:
        return window_index * WINDOW * 1000 // SPEECH_INPUT_RATE

    def _step(self, window: np.ndarray) -> TurnEvent | None:
        p = self._vad(window)
        index = self._num_windows
        self._num_windows += 1
        threshold = self.settings.threshold
        is_speech = p >= threshold
        # Hysteresis: below threshold - 0.15 is silence; in between continues a silence run.
        is_silence = p < max(threshold - _HYSTERESIS, 0.01) or (not is_speech and self._silence_run > 0)

        if self.state == "silence":
            if not is_speech:
                if self._padding_windows:
                    self._before.append(window)
                return None
            self.state, self._onset = "pending", index
            self._utterance, self._num_speech, self._silence_run = [], 0, 0

        self._utterance.append(window)
        if is_speech:
            self._num_speech += 1
            self._silence_run = 0
        elif is_silence:
            self._silence_run += 1

        if self.state == "pending":
            if self._num_speech >= self._min_speech_windows:
                self.state = "speaking"
                return SpeechStarted(audio_start_ms=self._ms(self._onset))
            if self._silence_run >= self._silence_windows:
                self._abandon()
            return None
        if (
            self._silence_run >= self._silence_windows
            or len(self._padding()) + len(self._utterance) >= self._max_windows
        ):
            return self._stop(index)
        return None

    def end_now(self) -> SpeechStopped | None:
        """The utterance being heard ends here (a client's commit while the VAD is on: OpenAI
        lets a push-to-talk client end its turn itself); None when none is being heard. It
        ends with the last full window: the samples after it stay the stream's, unheard."""
        if self.state == "silence":
            return None
        return self._stop(self._num_windows - 1)

    def _abandon(self) -> None:
        # Too short to be speech: the windows become padding candidates again.
        windows = self._utterance
        self.state, self._utterance = "silence", []
        if self._padding_windows:
            self._before.extend(windows[-self._padding_windows :])

    def _padding(self) -> list[np.ndarray]:
        """The windows before the onset that the utterance's audio starts with."""
        return list(self._before) if self._padding_windows else []

    def _stop(self, index: int) -> SpeechStopped:
        keep_tail = min(self._silence_run, self._padding_windows)
        body = self._utterance[: len(self._utterance) - self._silence_run + keep_tail]
        audio = np.concatenate(self._padding() + body).astype(np.float32, copy=False)
        self.state, self._utterance, self._silence_run = "silence", [], 0
        self._before.clear()
        return SpeechStopped(audio_end_ms=self._ms(index + 1), audio=audio)
