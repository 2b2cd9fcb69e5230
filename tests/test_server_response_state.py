"""ResponseState.pcm_between: any range of the audio generated so far, from the chunks it lies in
(the progressive recorder takes each second of a long answer this way)."""

import itertools

import numpy as np

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
