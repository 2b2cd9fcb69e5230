"""ResponseState.pcm_between: any range of the audio generated so far, from the chunks it lies in
(the progressive recorder takes each second of a long answer this way); what was heard of an
answer played at a speed other than 1."""

import itertools

import numpy as np

from kimiaudio.pipeline.events import TurnDone
from kimiaudio.server.session.response_state import ResponseState


def test_pcm_between_equals_a_slice_of_the_whole():
    r = ResponseState("both", None, 0, None, 0.0)
    sizes = [10, 1, 0, 25, 7]
    for size in sizes:
        r.add_pcm(np.random.default_rng(size).standard_normal(size).astype(np.float32))
    whole = np.concatenate(r.pcm)
    assert r.num_samples == whole.size == sum(sizes)
    for start, end in itertools.product(range(0, whole.size + 3), repeat=2):
        assert np.array_equal(r.pcm_between(start, end), whole[start:end]), (start, end)


def test_what_was_heard_at_a_speed_counts_the_codes_as_they_played():
    """At speed 1.5 each code's 1,920 samples play in 1,280: a cut after 2,561 played samples
    has heard three codes (the third being spoken), not two as at speed 1; at 0.5 a code plays
    in 3,840."""
    codes = list(range(10))
    for speed, played, heard in ((1.0, 2561, 2), (1.5, 2561, 3), (1.5, 2560, 2), (0.5, 3841, 2), (0.5, 3840, 1)):
        r = ResponseState("both", None, 0, None, 0.0, speed)
        r.add_pcm(np.zeros(round(len(codes) * 1920 / speed), np.float32))
        r.codes = list(codes)
        assert r.codes_heard(played, 1920) == codes[:heard], (speed, played)
        r.played_samples = played
        pcm, kept = r.heard(TurnDone(status="cancelled", audio_tokens=codes), 1920)
        assert pcm.size == played and kept == codes[:heard], (speed, played)
