"""Kimi-Audio-7B's LM config, and engine requests built by hand in its official token numbering.

The decode bench (decode_7b.py) runs random weights in the official shapes (random_weights
FULL) with no tokenizer: its prompts are speech codes and the official special-token ids
(docs/official-model.md, "Special tokens"), and its long prompt carries a Whisper feature at
every media position, as a spoken user turn does.
"""

from __future__ import annotations

import numpy as np
import torch

from kimiaudio.engine.request import EngineRequest, RequestPrompt
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.engine.stop_rules import RuleTokens
from kimiaudio.models.kimia_config import KimiaConfig
from kimiaudio.random_weights.lm import lm_config
from kimiaudio.random_weights.shapes import FULL

# The official special-token ids (the prompts here are built by hand in that numbering, not
# with the demo tokenizer): the LM finds the Whisper features between the media ids.
SPECIALS_7B = RuleTokens(text_blank=151666, text_eos=151667, msg_end=151645, media_end=151663)
MEDIA_BEGIN_7B = 151661
USER_MSG_START, SPEECH_CTD, ASSISTANT_MSG_START = 151670, 151676, 151671  # docs/official-model.md, "Special tokens"
# config.json of moonshotai/Kimi-Audio-7B-Instruct: the FULL shape's LM, the official media ids.
KIMI_AUDIO_7B = {**lm_config(FULL), "kimia_media_begin": MEDIA_BEGIN_7B, "kimia_media_end": SPECIALS_7B.media_end}
PROMPT_LEN = 128
PREFILL_LEN = 1000  # the long prompt: media begin, PREFILL_LEN - 5 continuous positions, 4 markers


class Prompts:
    """Distinct prompts (so the prefix cache never serves one from another) and their params."""

    def __init__(self, config: KimiaConfig, steps: int):
        self.config = config
        self.gen = np.random.default_rng(0)
        self.count = 0
        # ignore_eos: random weights may sample msg_end, and every step must run the whole batch.
        self.params = SamplingParams(seed=1, max_new_tokens=steps, ignore_eos=True)  # the default sampling

    def codes(self, n: int) -> list[int]:
        return self.gen.integers(self.config.kimia_token_offset, self.config.vocab_size, n).tolist()

    def short(self) -> EngineRequest:
        """PROMPT_LEN speech codes, no features."""
        self.count += 1
        return EngineRequest(
            f"r{self.count}",
            RequestPrompt(self.codes(PROMPT_LEN), [SPECIALS_7B.text_blank] * PROMPT_LEN, [0] * PROMPT_LEN, None),
            self.params,
            "both",
            SPECIALS_7B,
        )

    def long(self) -> EngineRequest:
        """PREFILL_LEN positions: a user turn of speech codes with a Whisper feature each."""
        self.count += 1
        cfg, n = self.config, PREFILL_LEN - 5
        audio = (
            [USER_MSG_START, cfg.kimia_media_begin]
            + self.codes(n)
            + [cfg.kimia_media_end, SPEECH_CTD, ASSISTANT_MSG_START]
        )
        mask = [0, 0] + [1] * n + [0, 0, 0]
        features = torch.from_numpy(self.gen.standard_normal((n, cfg.kimia_adaptor_input_dim), dtype=np.float32))
        return EngineRequest(
            f"r{self.count}",
            RequestPrompt(audio, [SPECIALS_7B.text_blank] * PREFILL_LEN, mask, features),
            SamplingParams(seed=1, max_new_tokens=4, ignore_eos=True),
            "both",
            SPECIALS_7B,
        )
