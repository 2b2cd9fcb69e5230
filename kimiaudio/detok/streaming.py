"""One answer's streaming detokenizer state (DetokStream): the official `detokenize_streaming`
as bookkeeping.

Follows PrefixStreamingFlowMatchingDetokenizer.detokenize_streaming (kimia_infer/models/
detokenizer/__init__.py) with its StreamingSemanticFMWrapper state, but owns no model: the
Detokenizer asks a stream for its next ChunkJob, runs the DiT and the vocoder for many streams
at once, and hands the results back (`finish_dit`, then `finish_vocoder`).
Per chunk (sizes, look-ahead and ODE steps from its ChunkSchedule, first chunk vs later ones):
tokens x4 (12.5 Hz -> 50 Hz frames), prefixed by the previous chunk's carried look-ahead frames;
the last look-ahead x4 frames are dropped (and carried) unless final;
the DiT prefix K/V grows by the kept frames and keeps the last max_kv_cache_frames; positions
restart before they would pass 4096: at 0 with an empty K/V, or, for a stream in a voice
(detok/voice_prefix.py), at the voice prefix (the official backup restored); a new stream
starts there too. Vocoder overlap: the first chunk returns
half its wav and holds the rest (pre_wav) with the mel tail (pre_mel); each later chunk vocodes
cat(pre_mel, mel), returns twice the held length (or half) with the first half Hamming
cross-faded against pre_wav; a final chunk returns its whole wav and resets the stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.config.chunk_schedule import MAX_POSITION, UPSAMPLE, ChunkSchedule
from kimiaudio.detok.flow_matching import ChunkJob, ChunkOutput
from kimiaudio.detok.voice_prefix import VoicePrefix
from kimiaudio.errors import KimiAudioError


def must_reset_positions(start: int, kept: int, next_frames: int, max_position: int) -> bool:
    """After a chunk that kept `kept` frames with positions now at `start`: restart positions
    at 0 (and drop the prefix K/V) before the next chunk? The official test is
    start + 2 * kept > max_position; next_frames (the next chunk's frames) only matters when
    chunks grow."""
    return start + max(2 * kept, next_frames) > max_position


@dataclass(frozen=True)
class StreamParams:
    schedule: ChunkSchedule
    mel_bins: int
    hop_size: int  # wav samples per mel frame
    vocab_size: int  # valid token ids are 0..vocab_size-1
    max_position: int = MAX_POSITION
    sample_rate: int = SPEECH_OUTPUT_RATE


class DetokStream:
    """One answer's stream of semantic tokens -> 24 kHz wav pieces. Not thread-safe; one owner."""

    def __init__(
        self,
        params: StreamParams,
        seed: int | None = None,
        noise_fn: Callable[[int], Tensor] | None = None,
        voice: VoicePrefix | None = None,
    ):
        self.params = params
        self.voice = voice  # shared, never modified: every (re)start of positions begins from it
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self.noise_fn = noise_fn  # tests inject captured noise: noise_fn(n_frames) -> [n_frames, mel_bins]
        self.trace: list[dict] | None = None  # set to a list to record every chunk (tests, debugging)
        self.pending: list[int] = []
        self.start_position = 0
        self.kv: Tensor | None = None  # [depth, 2, heads, frames, head_dim]: the prefix of the next chunk
        self._reset()

    def _reset(self) -> None:
        """The official clear_states (then prefill, in a voice): a fresh stream."""
        self._restart_positions()
        self.look_ahead_ids: Tensor | None = None  # [look-ahead frames] carried frame ids (CPU)
        self.pre_mel: Tensor | None = None  # [frames, mel_bins]
        self.pre_wav: Tensor | None = None  # [samples]
        self.num_chunks = 0
        self._job: ChunkJob | None = None
        self._final = False
        self._mel: Tensor | None = None

    def held_bytes(self) -> int:
        """The memory this stream holds between chunks: its prefix K/V (a voice's own prefix,
        which the voice cache holds, not counted) and the mel and wav it carries over."""
        held = [self.pre_mel, self.pre_wav, self._mel]
        if self.kv is not None and (self.voice is None or self.kv is not self.voice.kv):
            held.append(self.kv)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    @property
    def next_chunk_tokens(self) -> int:
        return self.params.schedule.tokens(self.num_chunks)

    @property
    def next_chunk_seconds(self) -> float:
        """Audio its next (non-final) chunk releases: the kept frames, of which a first chunk
        holds half back for the cross-fade (for the real-time guard's forecasts)."""
        schedule, index = self.params.schedule, self.num_chunks
        frames = UPSAMPLE * (schedule.tokens(index) - (schedule.look_ahead(index) if index == 0 else 0))
        if index == 0:
            frames //= 2
        return frames * self.params.hop_size / self.params.sample_rate

    @property
    def is_started(self) -> bool:
        return self.num_chunks > 0

    def push(self, tokens: list[int]) -> None:
        bad = [t for t in tokens if not 0 <= int(t) < self.params.vocab_size]
        if bad:
            raise KimiAudioError(f"detokenizer: token id {bad[0]} out of range 0..{self.params.vocab_size - 1}")
        self.pending.extend(int(t) for t in tokens)

    def ready(self, final: bool) -> bool:
        """True when a chunk is due: enough tokens buffered, or anything left to flush when final."""
        if final:
            return bool(self.pending) or self.is_started
        return len(self.pending) >= self.next_chunk_tokens

    def next_job(self, final: bool, ode_steps: int | None = None) -> ChunkJob:
        """Take the next chunk's tokens off the buffer (call only when `ready(final)`);
        `ode_steps` overrides the schedule's steps for this chunk (the real-time guard)."""
        schedule = self.params.schedule
        size = self.next_chunk_tokens
        is_final = final and len(self.pending) <= size
        take, self.pending = self.pending[:size], self.pending[size:]
        ids = torch.tensor(take, dtype=torch.long).repeat_interleave(UPSAMPLE)
        if self.look_ahead_ids is not None:
            ids = torch.cat([self.look_ahead_ids, ids])
        look_ahead = 0 if is_final else schedule.look_ahead(self.num_chunks) * UPSAMPLE
        if not is_final and ids.numel() <= look_ahead:
            raise KimiAudioError(
                f"detokenizer: a chunk of {ids.numel()} frames leaves nothing after {look_ahead} look-ahead frames"
            )
        noise = (
            self.noise_fn(ids.numel())
            if self.noise_fn
            else torch.randn(ids.numel(), self.params.mel_bins, generator=self.generator)
        )
        steps = ode_steps or schedule.steps(self.num_chunks)
        self._job = ChunkJob(ids, noise, self.start_position, self.kv, look_ahead, not is_final, steps)
        self._final = is_final
        return self._job

    def finish_dit(self, out: ChunkOutput) -> Tensor:
        """Take this chunk's mel and K/V; returns the mel to vocode [frames, mel_bins]."""
        job, p = self._current_job(), self.params
        kept = out.mel.shape[0]
        # carried into the next chunk (none after a chunk without look-ahead)
        self.look_ahead_ids = job.token_ids[-job.look_ahead :] if job.look_ahead > 0 else None
        if out.kv is not None:
            kv = out.kv if self.kv is None else torch.cat([self.kv, out.kv], dim=3)
            cap = p.schedule.max_kv_cache_frames
            kv = kv[:, :, :, -cap:] if kv.shape[3] > cap else kv
            self.kv = kv.contiguous()  # own storage: do not pin the whole batch's K/V
        self.start_position += kept
        self._mel = out.mel
        return out.mel if self.pre_mel is None else torch.cat([self.pre_mel, out.mel])

    def finish_vocoder(self, wav: Tensor) -> Tensor:
        """wav [samples] of the mel from finish_dit -> the float32 piece to play now."""
        job, hop = self._current_job(), self.params.hop_size
        mel = self._mel
        if mel is None:
            raise KimiAudioError("detokenizer: finish_vocoder before finish_dit")
        if self._final:
            out = wav
        elif self.pre_wav is None:
            half = hop * mel.shape[0] // 2
            out, self.pre_wav = wav[:half], wav[-half:].clone()
            self.pre_mel = mel[-mel.shape[0] // 2 :].clone()  # (-c)//2: one frame more than pre_wav for odd c
        else:
            out = self._cross_fade(wav, mel)
        if self.trace is not None:
            self.trace.append(
                dict(
                    start_position=job.start_position,
                    n_frames_in=job.token_ids.numel(),
                    prefix_frames=job.prefix_frames,
                    look_ahead=job.look_ahead,
                    is_final=self._final,
                    ode_steps=job.ode_steps,
                    semantic_tokens=job.token_ids,
                    noise=job.noise,
                    mel=mel,
                    wav=out.float(),
                )
            )
        if self._final:
            self._reset()  # the final chunk took every pending token
        else:
            self._advance(mel.shape[0])
        return out.float()

    def _current_job(self) -> ChunkJob:
        if self._job is None:
            raise KimiAudioError("detokenizer: no chunk in progress (next_job first)")
        return self._job

    def _cross_fade(self, wav: Tensor, mel: Tensor) -> Tensor:
        pre_wav = self.pre_wav
        if pre_wav is None:
            raise KimiAudioError("detokenizer: a cross-fade needs the previous chunk's held samples")
        held = pre_wav.shape[0]
        gen = 2 * held if wav.shape[0] > 2 * held else wav.shape[0] // 2
        out = wav[:gen].clone()
        half = gen // 2
        window = _hamming(gen, wav.device, wav.dtype)
        out[:half] = pre_wav[:half] * window[-half:] + out[:half] * window[:half]
        rest = wav.shape[0] - gen
        self.pre_wav = wav[-rest:].clone()
        self.pre_mel = mel[-(rest // self.params.hop_size) :].clone()  # python slicing: 0 keeps the whole mel
        return out

    def _advance(self, kept: int) -> None:
        """After a non-final chunk: the official position reset."""
        self.num_chunks += 1
        carried = 0 if self.look_ahead_ids is None else self.look_ahead_ids.numel()
        next_frames = carried + self.next_chunk_tokens * UPSAMPLE
        if must_reset_positions(self.start_position, kept, next_frames, self.params.max_position):
            self._restart_positions()  # look-ahead, pre_mel and pre_wav carry on

    def _restart_positions(self) -> None:
        """Positions and K/V of a stream's start: the voice prefix (the official state_dict_backup
        taken after prefill), or position 0 and no K/V without a voice."""
        self.start_position = 0 if self.voice is None else self.voice.next_position
        self.kv = None if self.voice is None else self.voice.kv


@lru_cache(maxsize=64)
def _hamming(length: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The official cross-fade window: periodic Hamming made in fp32 on the CPU, then cast. A
    pure function of its arguments, kept because chunk lengths repeat (one CPU window and one
    host-to-device copy per length, not per chunk)."""
    return torch.hamming_window(length).to(device=device, dtype=dtype)
