"""The idle timeout's clock (kimiaudio/server/session/idle_timer.py): a silence is measured on
the input audio, from the first audio heard while the session waits for its user; anything
else (speech, an answer, even one between two pieces of audio: another stretch) starts it
again; only its last `max_samples` are committed."""

import numpy as np

from kimiaudio.server.session.idle_timer import IdleTimer

RATE = 16000


def chunk(seconds: float, value: float = 0.0) -> np.ndarray:
    return np.full(int(seconds * RATE), value, np.float32)


def test_a_silence_times_out_once_it_has_lasted_the_timeout_while_waiting():
    timer = IdleTimer()
    assert timer.heard(chunk(1.0), None, 1500, RATE * 60) is None  # not waiting: no timer
    assert timer.heard(chunk(1.0), "waiting", None, RATE * 60) is None  # no timeout set
    assert timer.heard(chunk(1.0), "waiting", 1500, RATE * 60) is None  # 1 s of 1.5
    timeout = timer.heard(chunk(1.0, 0.5), "waiting", 1500, RATE * 60)
    assert (timeout.audio_start_ms, timeout.audio_end_ms) == (2000, 4000)
    assert timeout.audio.size == 2 * RATE and timeout.audio[-1] == 0.5  # the silence's own audio
    assert timer.heard(chunk(1.0), "waiting", 1500, RATE * 60) is None  # a new silence starts after it


def test_anything_but_waiting_starts_the_silence_again_and_the_audio_kept_is_bounded():
    timer = IdleTimer()
    timer.heard(chunk(1.2), "waiting", 1500, RATE)
    assert timer.heard(chunk(0.1), None, 1500, RATE) is None  # speech, or an answer: from zero again
    assert timer.heard(chunk(1.2), "waiting", 1500, RATE) is None
    timeout = timer.heard(chunk(0.4, 0.25), "waiting", 1500, RATE)
    assert (timeout.audio_start_ms, timeout.audio_end_ms) == (1300, 2900)
    assert timeout.audio.size == RATE and timeout.audio[-1] == 0.25  # the last second only


def test_a_new_stretch_or_a_restart_starts_the_silence_again_and_the_clock_counts_all_audio():
    timer = IdleTimer()
    timer.heard(chunk(1.2), "after answer 1", 1500, RATE)
    # An answer started and ended between two pieces of audio: its stretch has another name.
    assert timer.heard(chunk(1.2), "after answer 2", 1500, RATE) is None
    timer.restart()  # (a cleared buffer, turn detection switched)
    assert timer.heard(chunk(1.2), "after answer 2", 1500, RATE) is None
    timer.heard(chunk(1.0), None, None, 0)  # audio written with turn detection off: the clock runs
    timer.heard(chunk(1.0), "after answer 2", 1500, RATE)
    timeout = timer.heard(chunk(0.5), "after answer 2", 1500, RATE)
    assert (timeout.audio_start_ms, timeout.audio_end_ms) == (4600, 6100)  # 1.2 x 3 + 1.0 written before it


def test_a_possible_onset_holds_the_timeout_until_it_is_settled():
    """While the VAD hears what may be speech (not yet min_speech_ms of it), the silence does not
    time out; once it was nothing, the timeout comes with the silence measured all along."""
    timer = IdleTimer()
    assert timer.heard(chunk(1.4), "waiting", 1500, RATE * 60) is None
    assert timer.heard(chunk(0.2), "waiting", 1500, RATE * 60, hold=True) is None  # (1.6 s: held)
    timeout = timer.heard(chunk(0.1), "waiting", 1500, RATE * 60)
    assert (timeout.audio_start_ms, timeout.audio_end_ms) == (0, 1700)
