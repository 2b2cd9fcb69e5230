"""HeardText: what a spoken answer cut short (a barge-in, response.cancel, a
conversation.item.truncate, the session's close) keeps of its text, as OpenAI's truncate drops
the transcript that was not heard.

A spoken answer is generated one position at a time, each a text token and an audio token,
in the official layout (docs/official-model.md): the text stream runs from the first position;
the audio stream holds `audio_delay` blanks (6), then one speech code per position until the
answer ends. The pipeline reports every text token fed back, one per position (TurnDone's
text_tokens: blanks and the text EOS included), and the speech codes (its audio_tokens): the
k-th code (from 0) was generated at position audio_delay + k. Each code is samples_per_code
samples of speech (80 ms with the official detokenizer).

The rule: an answer of which the first n codes were heard (n: the samples heard over
samples_per_code, rounded up, as ResponseState.heard keeps them) keeps the text tokens of its
first audio_delay + n positions, and the text those decode to as the pipeline decodes an
answer (the ids before the text EOS and below the audio offset; a multi-byte character cut in
two left out), never more than the text that was sent (a stop string may have ended it
before). Nothing heard, nothing kept. The next prompt's history holds that text beside the
heard codes (text/prompt.py, an "audio-text" message: the text encoded again, as any answer's
is). The text leads the speech, so a word being spoken when the answer was cut is kept, and up
to audio_delay positions of text (480 ms) after it may be too. A position whose audio token was
no code (the pipeline drops those) shifts the mapping later: less text is kept, never more.

When the pipeline did not confirm the cut in time (no text tokens reported), the positions are
unknown and no text is kept; the codes of what was heard still carry it into the next prompt.
An answer in text alone is not cut here: the text sent is what was heard.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from kimiaudio.text.special_tokens import SpecialTokens
from kimiaudio.text.tokenizer import KimiTokenizer


@dataclass(frozen=True)
class HeardText:
    tokenizer: KimiTokenizer
    specials: SpecialTokens

    def positions(self, codes_heard: int) -> int:
        """How many of the answer's positions were heard, once `codes_heard` codes were."""
        return self.specials.audio_delay + codes_heard if codes_heard > 0 else 0

    def cut(self, sent: str, text_tokens: Sequence[int], codes_heard: int) -> tuple[str, list[int]]:
        """(the text heard, its text tokens) of an answer whose text was `sent`, whose text
        stream was `text_tokens`, and whose first `codes_heard` codes were heard."""
        kept = list(text_tokens[: self.positions(codes_heard)])
        ids, ended = [], len(kept) == len(text_tokens)
        for token in kept:
            if token == self.specials.text_eos:
                ended = True
                break
            if token < self.specials.token_offset:
                ids.append(token)
        heard = self.tokenizer.decode(ids)
        if not ended:  # more text came after the cut: a character it split in two is left out
            heard = heard.rstrip("\ufffd")
        return os.path.commonprefix([heard, sent]), kept  # (a stop string may have cut `sent` shorter)
