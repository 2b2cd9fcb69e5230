"""A voice prompt's DiT prefix: the K/V a stream in that voice attends to from its first chunk.

Follows the official PrefixStreamingFlowMatchingDetokenizer.prefill -> StreamingSemanticFMWrapper
.prefill / prefill_chunk (kimia_infer/models/detokenizer): the reference's log-mel (detok/mel.py)
is padded with zeros or cut to its frame-rate ids (12.5 Hz codes x4), then split into a rest
and up to max_prompt_chunk chunks of chunk_size frames taken from the end; each part runs the
DiT once at t = 0.999 on the clean mel over the K/V so far (positions advancing), and the K/V
keep the last max_kv_cache_frames after each part (the official update_incremental_state,
which reserves no room for the prompt). The result is immutable and shared by every stream in
that voice: a stream grows its own K/V by concatenation, never in place. A prompt's codes are
checked first (`voice_codes`): in the DiT's vocabulary, and leaving room for speech after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from kimiaudio.config.chunk_schedule import UPSAMPLE
from kimiaudio.errors import KimiAudioError

PROMPT_CHUNK_FRAMES = 150  # official prefill(chunk_size=150)
MAX_PROMPT_CHUNKS = 10  # official get_audio_detokenizer(max_prompt_chunk=10)


@dataclass(frozen=True)
class VoicePrefix:
    kv: Tensor  # [depth, 2, heads, frames, head_dim] on the DiT's device
    next_position: int  # positions the prompt used: the stream's first chunk starts here

    @property
    def frames(self) -> int:
        return self.kv.shape[3]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def voice_codes(codes: Sequence[int] | Tensor, vocab_size: int, longest_chunk_frames: int, max_position: int) -> Tensor:
    """A voice prompt's 12.5 Hz codes as a long tensor [n], checked: at least one, each below
    the DiT's `vocab_size`, and few enough that the DiT's `max_position` positions leave room
    after the prompt for speech (two chunks of the schedule's longest)."""
    codes = torch.as_tensor(codes, dtype=torch.long).reshape(-1)
    if codes.numel() == 0:
        raise KimiAudioError("a voice prompt needs at least one semantic code")
    bad = codes[(codes < 0) | (codes >= vocab_size)]
    if bad.numel():
        raise KimiAudioError(f"voice prompt: code {int(bad[0])} out of range 0..{vocab_size - 1}")
    frames = UPSAMPLE * codes.numel()
    if frames + 2 * longest_chunk_frames > max_position:
        raise KimiAudioError(
            f"voice prompt of {frames} frames: this checkpoint's {max_position} DiT positions leave "
            f"no room for speech after it (at most {max_position - 2 * longest_chunk_frames} frames)"
        )
    return codes


def prefill_spans(
    frames: int, chunk_frames: int = PROMPT_CHUNK_FRAMES, max_chunks: int = MAX_PROMPT_CHUNKS
) -> list[tuple[int, int]]:
    """[start, end) frames of each prefill call: the rest first (when not empty), then whole
    chunks, the last one ending at `frames` (the official split)."""
    num_chunks = min(frames // chunk_frames, max_chunks)
    rest = frames - num_chunks * chunk_frames
    spans = [(0, rest)] if rest > 0 else []  # the official empty call adds nothing to the K/V
    return spans + [(rest + i * chunk_frames, rest + (i + 1) * chunk_frames) for i in range(num_chunks)]


def prompt_mel(mel: Tensor, frames: int) -> Tensor:
    """The official fit of the reference mel [m, bins] to its ids: zero-padded or cut to `frames`."""
    if mel.shape[0] < frames:
        return torch.nn.functional.pad(mel, (0, 0, 0, frames - mel.shape[0]))
    return mel[:frames]


def build_voice_prefix(
    flow, mel: Tensor, codes: Tensor, max_kv_cache_frames: int, max_chunks: int = MAX_PROMPT_CHUNKS
) -> VoicePrefix:
    """The prefix of a reference: `mel` [m, bins] (its log-mel), `codes` [n] its 12.5 Hz codes;
    `flow` is the FlowMatcher (one DiT call per span, counted in its num_prefill_calls)."""
    ids = codes.reshape(-1).long().cpu().repeat_interleave(UPSAMPLE)
    mel = prompt_mel(mel.float().cpu(), ids.numel())
    kv: Tensor | None = None
    for start, end in prefill_spans(ids.numel(), max_chunks=max_chunks):
        chunk_kv = flow.prefill_chunk(ids[start:end], mel[start:end], start, kv)
        kv = chunk_kv if kv is None else torch.cat([kv, chunk_kv], dim=3)
        kv = kv[:, :, :, -max_kv_cache_frames:].contiguous()
    if kv is None:
        raise KimiAudioError("a voice prefix needs a reference of at least one code")
    return VoicePrefix(kv, ids.numel())
