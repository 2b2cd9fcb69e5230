"""Silero VAD + turn detection (kimiaudio/audio/vad.py) on real speech made by espeak-ng."""

import numpy as np
import torch

from kimiaudio.audio.vad import (
    WINDOW,
    SileroVad,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    TurnSettings,
    vad_executor,
)

from helpers.audio import silence


def _feed(detector, pcm, rng):
    def run():
        events, pos = [], 0
        while pos < pcm.size:  # ragged chunks, like network frames
            n = int(rng.integers(100, 1500))
            events.extend((pos + n, e) for e in detector.push(pcm[pos : pos + n]))
            pos += n
        return events

    # As the server does: on the VAD thread, which runs torch with one intra-op thread.
    with vad_executor() as executor:
        return executor.submit(run).result()


def test_loading_silero_does_not_change_torch_threads():
    before = torch.get_num_threads()
    SileroVad()
    assert torch.get_num_threads() == before


def test_two_utterances_give_two_turns_with_padding(speech):
    a, b = speech
    stream = np.concatenate([silence(1.0), a, silence(1.5), b, silence(1.0)])
    settings = TurnSettings(threshold=0.5, min_speech_ms=250, silence_ms=500, prefix_padding_ms=300)
    events = _feed(TurnDetector(SileroVad(), settings), stream, np.random.default_rng(0))
    kinds = [type(e).__name__ for _, e in events]
    assert kinds == ["SpeechStarted", "SpeechStopped", "SpeechStarted", "SpeechStopped"], kinds
    (_, s1), (at1, e1), (_, s2), (at2, e2) = events
    # espeak pads its output with silence: find where the voice really starts and ends.
    voiced = np.flatnonzero(np.abs(stream) > 0.02)
    a_on, a_off = voiced[0], voiced[voiced < 16000 + a.size][-1]
    b_on = voiced[voiced >= 16000 + a.size][0]
    assert abs(s1.audio_start_ms - a_on / 16) <= 100
    assert abs(s2.audio_start_ms - b_on / 16) <= 100
    # The end is decided about silence_ms after the voice ends (the model's own decay aside).
    assert a_off + 0.4 * 16000 <= at1 <= a_off + 0.8 * 16000 + 1500
    for event, clip in ((e1, a), (e2, b)):
        # padding (<= 300 ms) + speech + at most 300 ms of trailing silence
        assert clip.size * 0.8 <= event.audio.size <= clip.size + 0.6 * 16000 + 2 * WINDOW
        assert event.audio.dtype == np.float32
    # The committed audio really contains the utterance: correlate with the source.
    corr = np.correlate(e1.audio, a[4000:8000], mode="valid")
    assert np.max(corr) > 0.9 * np.dot(a[4000:8000], a[4000:8000])


def test_silence_and_noise_give_no_turn():
    rng = np.random.default_rng(1)
    stream = np.concatenate([silence(1.0), 0.01 * rng.standard_normal(32000).astype(np.float32)])
    assert _feed(TurnDetector(SileroVad()), stream, rng) == []


def test_short_blip_is_ignored_by_min_speech(speech):
    a, _ = speech
    onset = int(np.argmax(np.abs(a) > 0.05))
    blip = a[onset : onset + 1600]  # 100 ms of speech
    settings = TurnSettings(min_speech_ms=400)
    det = TurnDetector(SileroVad(), settings)
    assert _feed(det, np.concatenate([silence(0.5), blip, silence(1.5)]), np.random.default_rng(2)) == []
    assert det.state == "silence"


def test_state_machine_with_scripted_probabilities():
    # The detector only sees the probabilities: script them window by window.
    probs = iter([0.0] * 5 + [0.9] * 10 + [0.4] * 3 + [0.1] * 20 + [0.0] * 5)
    settings = TurnSettings(threshold=0.5, min_speech_ms=250, silence_ms=320, prefix_padding_ms=64)
    det = TurnDetector(lambda w: next(probs), settings)
    events = []
    for i in range(43):
        events += det.push(np.full(WINDOW, i, dtype=np.float32))
    started, stopped = events
    assert isinstance(started, SpeechStarted) and started.audio_start_ms == 5 * 32
    assert isinstance(stopped, SpeechStopped)
    # The 0.4 windows (between 0.35 and 0.5) do not start a silence run; 10 silent windows
    # (320 ms) end the turn after window 27.
    assert stopped.audio_end_ms == 28 * 32
    values = stopped.audio.reshape(-1, WINDOW)[:, 0].astype(int).tolist()
    assert values == [3, 4] + list(range(5, 18)) + [18, 19]  # 2 padding, speech, 2 trailing


def test_configure_changes_thresholds_live():
    det = TurnDetector(lambda w: 0.6, TurnSettings(threshold=0.5, min_speech_ms=32))
    assert isinstance(det.push(np.zeros(WINDOW, np.float32))[0], SpeechStarted)
    det.reset()
    det.configure(TurnSettings(threshold=0.7, min_speech_ms=32))
    assert det.push(np.zeros(4 * WINDOW, np.float32)) == []


def test_an_utterance_ends_when_the_client_commits_it():
    """end_now (a client's commit with the VAD on): nothing while silent; during speech, the
    utterance so far with its padding, and the detector is silent again, its clock going on."""
    probs = iter([0.0] * 4 + [0.9] * 12 + [0.9] * 3)
    settings = TurnSettings(threshold=0.5, min_speech_ms=96, silence_ms=320, prefix_padding_ms=64)
    det = TurnDetector(lambda w: next(probs), settings)
    assert det.push(np.zeros(3 * WINDOW, np.float32)) == [] and det.end_now() is None
    events = []
    for i in range(3, 16):
        events += det.push(np.full(WINDOW, i, dtype=np.float32))
    det.push(np.full(100, 16, dtype=np.float32))  # (not yet a window: the stream's, not the utterance's)
    assert [type(e) for e in events] == [SpeechStarted] and det.is_speaking
    stopped = det.end_now()
    assert isinstance(stopped, SpeechStopped) and stopped.audio_end_ms == 16 * 32
    assert stopped.audio.reshape(-1, WINDOW)[:, 0].astype(int).tolist() == [0] + list(range(3, 16))  # 2 padding
    assert not det.is_speaking and det.end_now() is None
    # Speech goes on after the commit: a new utterance, timed on the same clock.
    events = det.push(np.full(3 * WINDOW - 100, 17, dtype=np.float32))
    assert [type(e) for e in events] == [SpeechStarted] and events[0].audio_start_ms == 16 * 32


def test_speech_past_the_limit_is_cut_within_it_and_goes_on_as_the_next_utterance(speech):
    """An utterance cut at max_speech_s is no longer than it, its padding included (the server
    refuses a longer turn); the speech after the cut is the next utterance."""
    a, b = speech
    stream = np.concatenate([silence(1.0), a, b, silence(2.0)])  # one stretch of speech, then silence
    voiced = np.flatnonzero(np.abs(stream) > 0.02)
    in_b = voiced[voiced >= 16000 + a.size]
    padding = int(0.3 * 16000)
    # The limit: from the padding before the voice to the middle of b (a word, not a pause);
    # the rest of b and the silence that ends it fit in it.
    limit = (in_b[0] + in_b[-1]) // 2 - voiced[0] + padding
    settings = TurnSettings(min_speech_ms=250, silence_ms=800, prefix_padding_ms=300, max_speech_s=limit / 16000)
    events = _feed(TurnDetector(SileroVad(), settings), stream, np.random.default_rng(3))
    kinds = [type(e).__name__ for _, e in events]
    assert kinds == ["SpeechStarted", "SpeechStopped", "SpeechStarted", "SpeechStopped"], kinds
    _, (_, cut), (_, rest), (_, end) = events
    assert limit - WINDOW < cut.audio.size <= limit  # filled to the limit, never past it
    cut_at = cut.audio_end_ms * 16  # the stream's audio up to the cut, the padding included
    assert np.array_equal(cut.audio, stream[cut_at - cut.audio.size : cut_at])
    assert 0 <= rest.audio_start_ms - cut.audio_end_ms <= 300  # the speech went on at once
    assert end.audio_end_ms * 16 >= voiced[-1] + 0.8 * 16000  # the rest ended with the silence
    assert np.array_equal(end.audio[: voiced[-1] - cut_at], stream[cut_at : voiced[-1]])  # nothing lost between
