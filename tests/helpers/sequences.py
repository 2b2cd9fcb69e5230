"""Engine sequences built in tests without a model or a request."""

from __future__ import annotations

from kimiaudio.engine.request import ANSWER_PRIORITY
from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
from kimiaudio.engine.sequence import PromptPositions, Sequence
from kimiaudio.engine.stop_rules import RuleTokens, StreamRules

RULE_TOKENS = RuleTokens(text_blank=0, text_eos=1, msg_end=2, media_end=3)


def make_sequence(
    seq_id,
    audio,
    *,
    block_size,
    max_new=1,
    text=None,
    use_text=None,
    digests=None,
    features=None,
    priority=ANSWER_PRIORITY,
    output_type="text",
    audio_delay=2,
):
    """A sequence over the prompt `audio` (text ids 7 unless given), greedy, with the rules of
    a request of `output_type` for `max_new` steps past every stop token (a "both" one awaits
    its first audio for `audio_delay` steps). digests: per position, the feature digest at a
    continuous position or None; features: their rows [N, adaptor_dim]."""
    n = len(audio)
    prompt = PromptPositions(
        list(audio),
        list(text) if text is not None else [7] * n,
        list(use_text) if use_text is not None else [True] * n,
        [d is not None for d in digests] if digests else [False] * n,
        list(digests) if digests else [None] * n,
    )
    return Sequence(
        seq_id,
        f"r{seq_id}",
        prompt,
        block_size=block_size,
        max_num_tokens=n + max_new - 1,
        priority=priority,
        rules=StreamRules(output_type, RULE_TOKENS, audio_delay, max_new, ignore_eos=True),
        params=SamplingParams.greedy(),
        random=RequestRandom(0),
        features=features,
    )
