"""The two-stream Kimi-Audio prompt: messages -> audio stream, text stream, continuous mask.

Follows the official `KimiAPromptManager.get_prompt` / `tokenize_message` in its later
upstream form (docs/official-model.md, "Prompt format"): a role prefix when the role changes, text
messages on the text stream (assistant text ends with the text EOS), audio messages between
media markers with the whisper features on the code positions, ct/ctd after the last audio
of a role run, msg_end at the end of every role run, and the generation prefix
[assistant_msg_start | blank]. "audio-text" messages carry an assistant's spoken answer in the
history (speech codes on the audio stream after the audio delay, its text on the text stream).
Per position the streams hold `[audio_ids[i] | text_ids[i]]`.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kimiaudio.errors import AudioInputError, KimiAudioError
from kimiaudio.text.output_type import check_output_type
from kimiaudio.text.special_tokens import SpecialTokens

ROLES = ("user", "assistant")
KINDS = ("text", "audio", "audio-text")
# The instruction of the official ASR example (infer.py): a user text turn before the audio.
ASR_INSTRUCTION = "请将音频内容转换为文字。"


@dataclass
class Message:
    role: str  # "user" | "assistant"
    kind: str  # "text" | "audio" | "audio-text"
    text: str = ""  # kind "text" and "audio-text"
    audio_tokens: list[int] | None = None  # VQ codes (no offset) for "audio" and "audio-text"
    features: torch.Tensor | None = None  # [N, adaptor_dim] whisper features of an "audio" message

    @classmethod
    def assistant_reply(cls, text: str, codes: Sequence[int] | None) -> Message:
        """An assistant answer as history: spoken (audio-text) when it has speech codes, else text."""
        if codes:
            return cls("assistant", "audio-text", text=text, audio_tokens=list(codes))
        return cls("assistant", "text", text=text)

    def validate(self, index: int, specials: SpecialTokens) -> None:
        where = f"message {index} ({self.role} {self.kind})"
        if self.role not in ROLES:
            raise KimiAudioError(f"message {index}: role {self.role!r} is not one of {ROLES}")
        if self.kind not in KINDS:
            raise KimiAudioError(f"message {index}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "text":
            return
        if not self.audio_tokens:
            raise AudioInputError(f"{where}: needs a non-empty audio_tokens list of VQ codes")
        limit = specials.num_audio_codes
        bad = [c for c in self.audio_tokens if not _is_code(c) or c < 0 or (limit is not None and c >= limit)]
        if bad:
            raise AudioInputError(
                f"{where}: audio code {bad[0]!r} out of range (expected 0..{limit - 1 if limit else 'N'})"
            )
        if self.kind == "audio" and self.features is not None:
            rows = _feature_rows(self.features, where)
            if rows.shape[0] != len(self.audio_tokens):
                raise AudioInputError(
                    f"{where}: {rows.shape[0]} whisper feature rows for {len(self.audio_tokens)} audio codes "
                    "(expected one 12.5 Hz feature row per code)"
                )


@dataclass
class Prompt:
    audio_ids: list[int]
    text_ids: list[int]
    continuous_mask: list[int]  # 1 where a whisper feature row is added (audio code positions)
    features: list[torch.Tensor] = field(default_factory=list)  # one [N_k, adaptor_dim] per audio message
    message_starts: list[int] = field(default_factory=list)  # the position each message begins at

    def __len__(self) -> int:
        return len(self.audio_ids)

    def features_tensor(self) -> torch.Tensor | None:
        """All feature rows in position order, [sum N_k, adaptor_dim]; None without features."""
        if not self.features:
            return None
        return torch.cat([_feature_rows(f, f"feature {k}") for k, f in enumerate(self.features)], dim=0)

    def validate(self) -> None:
        """Equal stream lengths, and one feature row per continuous position (when features
        are given at all: a prompt built from codes alone has none)."""
        if not (len(self.audio_ids) == len(self.text_ids) == len(self.continuous_mask)):
            raise ValueError(
                f"prompt streams differ in length: audio {len(self.audio_ids)}, text {len(self.text_ids)}, "
                f"mask {len(self.continuous_mask)}"
            )
        feats = self.features_tensor()
        positions = sum(self.continuous_mask)
        if feats is not None and feats.shape[0] != positions:
            raise AudioInputError(
                f"prompt has {positions} continuous (audio code) positions but {feats.shape[0]} whisper feature rows"
            )


def build_prompt(messages: Sequence[Message], output_type: str, tokenizer, specials: SpecialTokens) -> Prompt:
    """The official prompt of `messages` followed by the generation prefix."""
    check_output_type(output_type)
    for index, message in enumerate(messages):
        message.validate(index, specials)
    with_features = [m.features is not None for m in messages if m.kind == "audio"]
    if any(with_features) and not all(with_features):
        raise AudioInputError("either every audio message has whisper features or none has")

    builder = _Streams(specials.text_blank)
    features: list[torch.Tensor] = []
    starts: list[int] = []
    for index, message in enumerate(messages):
        starts.append(len(builder.audio_ids))
        starts_run = index == 0 or messages[index - 1].role != message.role
        ends_run = index == len(messages) - 1 or messages[index + 1].role != message.role
        if starts_run:
            builder.audio(specials.user_msg_start if message.role == "user" else specials.assistant_msg_start)
        if message.kind == "text":
            _add_text(builder, message, tokenizer, specials)
        elif message.kind == "audio":
            _add_audio(builder, message, specials, ct=ends_run, output_type=output_type)
            if message.features is not None:
                features.append(_feature_rows(message.features, f"message {index}"))
        else:
            _add_audio_text(builder, message, tokenizer, specials)
        if ends_run:
            builder.audio(specials.msg_end)
    builder.audio(specials.assistant_msg_start)  # generation prefix, no msg_end
    prompt = Prompt(builder.audio_ids, builder.text_ids, builder.mask, features, starts)
    prompt.validate()
    return prompt


class _Streams:
    """Appends aligned positions; the other stream gets a blank (KimiAContent's role)."""

    def __init__(self, blank: int):
        self.blank = blank
        self.audio_ids: list[int] = []
        self.text_ids: list[int] = []
        self.mask: list[int] = []

    def audio(self, token: int, continuous: bool = False) -> None:
        self.pair(token, self.blank, continuous)

    def text(self, token: int) -> None:
        self.pair(self.blank, token)

    def pair(self, audio_id: int, text_id: int, continuous: bool = False) -> None:
        self.audio_ids.append(audio_id)
        self.text_ids.append(text_id)
        self.mask.append(int(continuous))


def _add_text(builder: _Streams, message: Message, tokenizer, specials: SpecialTokens) -> None:
    for token in tokenizer.encode(message.text):
        builder.text(token)
    if message.role == "assistant":
        # Later upstream: an assistant's text ends with the text EOS, as when it was generated.
        builder.text(specials.text_eos)


def _add_audio(builder: _Streams, message: Message, specials: SpecialTokens, ct: bool, output_type: str) -> None:
    builder.audio(specials.media_begin)
    for code in message.audio_tokens or ():
        builder.audio(int(code) + specials.token_offset, continuous=True)
    builder.audio(specials.media_end)
    if ct:
        # Tells the model what to answer with: ct = text only, ctd = speech and text.
        builder.audio(specials.speech_ct if output_type == "text" else specials.speech_ctd)


def _add_audio_text(builder: _Streams, message: Message, tokenizer, specials: SpecialTokens) -> None:
    """An answer as the model generated it: `audio_delay` blank audio positions, then the speech
    codes (no media markers, no features); the text runs from the first position, padded with
    blanks to the audio length. No text EOS (upstream writes none here).

    If the text is longer than delay + speech (upstream asserts), we pad the AUDIO stream with
    blanks after the speech instead of cutting the text: no words are lost from the history, both
    streams stay aligned, and a blank audio position is what the model itself emits while only
    its text runs (its first `audio_delay` steps). Our own generations never hit this case: they
    stop when the audio ends, so their text is never longer than their audio.
    """
    text_tokens = tokenizer.encode(message.text)
    audio = [specials.text_blank] * specials.audio_delay + [
        int(c) + specials.token_offset for c in message.audio_tokens or ()
    ]
    length = max(len(audio), len(text_tokens))
    audio += [specials.text_blank] * (length - len(audio))
    text = text_tokens + [specials.text_blank] * (length - len(text_tokens))
    for audio_id, text_id in zip(audio, text):
        builder.pair(audio_id, text_id)


def _is_code(value) -> bool:
    """An integer (Python, numpy or 0-dim torch), not a bool or float."""
    try:
        return not isinstance(value, bool) and operator.index(value) == value
    except TypeError:
        return False


def _feature_rows(features: torch.Tensor, where: str) -> torch.Tensor:
    """[N, D] rows of a feature tensor given as [N, D] or [1, N, D]."""
    if not isinstance(features, torch.Tensor):
        raise AudioInputError(f"{where}: whisper features must be a tensor, got {type(features).__name__}")
    if features.dim() == 3 and features.shape[0] == 1:
        features = features[0]
    if features.dim() != 2:
        raise AudioInputError(f"{where}: whisper features must be [N, adaptor_dim], got shape {tuple(features.shape)}")
    return features
