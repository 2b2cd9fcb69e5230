"""Semantic tokens -> 24 kHz speech: the DiT flow matcher and the BigVGAN vocoder, batched.

`detokenize` streams all tokens at once through a stream's chunk schedule: with
`preset = "official"` (config/chunk_schedule.py) that is the official KimiAudio.detokenize_audio
(chunks of 30 tokens through detokenize_streaming with look-ahead and cross-fade).
`step_batch` is what the serving loop calls each step: it runs the chunks due across streams
(one per stream when serving), the DiT for all chunks with the same ODE step count in one
padded forward per step (bucket shapes, CUDA graphs on CUDA), the vocoder once per group of
equal mel lengths (edge padding sees the ends, so only equal lengths share a forward). Each
stream's output equals running it alone.
`prepare_for_serving` captures the graphs before serving; `guard_settings` and `cost` feed the
real-time guard (detok/realtime_guard.py), whose step counts come back in DetokItem.ode_steps.
`voice_prefix` turns a reference voice into the DiT prefix its streams start from
(detok/voice_prefix.py); streams in different voices batch together like any others.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.config import DetokConfig
from kimiaudio.config.chunk_schedule import MAX_POSITION, UPSAMPLE, ChunkSchedule
from kimiaudio.detok.buckets import Buckets
from kimiaudio.detok.chunk_shapes import rehearse
from kimiaudio.detok.dit_vocoder_graphs import AnnouncedCapture, DiTStepGraphs, VocoderGraphs, capture
from kimiaudio.detok.flow_matching import FlowMatcher
from kimiaudio.detok.mel import VocoderMel
from kimiaudio.detok.realtime_guard import CostEstimate, GuardSettings
from kimiaudio.detok.streaming import DetokStream, StreamParams
from kimiaudio.detok.vocoder_batch import VocoderBatcher
from kimiaudio.detok.voice_prefix import MAX_PROMPT_CHUNKS, VoicePrefix, build_voice_prefix, voice_codes
from kimiaudio.errors import CheckpointError, KimiAudioError
from kimiaudio.models.bigvgan import BigVGAN, load_vocoder
from kimiaudio.models.dit import DiTPrefix, load_dit


class Detokenizer:
    """Not thread-safe: every call shares its static buffers and CUDA graphs, so one thread at a
    time (the pipeline's detokenizer worker; the offline `detokenize` only when that is idle)."""

    def __init__(
        self,
        dit: DiTPrefix,
        vocoder: BigVGAN,
        cfg: DetokConfig,
        bucketed: bool | None = None,
        capture_fn: Callable | None = None,
        mel: VocoderMel | None = None,
    ):
        """`mel`: the vocoder's mel settings (vocoder/config.json), needed for voice prompts.
        `bucketed`: pad batches to the planned bucket shapes (default: when CUDA graphs are
        on, which need fixed shapes; otherwise each batch runs at its own shape, same code).
        `capture_fn`: a stand-in for dit_vocoder_graphs.capture, to run the graph path on the CPU."""
        self.dit, self.vocoder, self.cfg, self.mel = dit, vocoder, cfg, mel
        self.device = dit.input_linear.weight.device
        self.schedule = ChunkSchedule.from_config(cfg, self._max_position())  # checks every [detok] setting
        on_cuda = self.device.type == "cuda"
        self.uses_graphs = capture_fn is not None or (on_cuda and cfg.cuda_graphs)
        bucketed = self.uses_graphs if bucketed is None else bucketed
        if self.uses_graphs and not bucketed:
            raise KimiAudioError("Detokenizer: CUDA graphs need bucketed shapes")
        self.buckets = Buckets.for_schedule(self.schedule, cfg.max_batch_sessions, exact=not bucketed)
        self.dit_graphs: DiTStepGraphs | None = None
        self.vocoder_graphs: VocoderGraphs | None = None
        self.graph_capture = AnnouncedCapture(capture_fn or capture)  # on_capture: told as each begins
        if self.uses_graphs:  # one pool and one capture stream for every graph of this detokenizer
            pool = torch.cuda.graph_pool_handle() if on_cuda else None
            stream = torch.cuda.Stream(self.device) if on_cuda else None
            graph_capture = self.graph_capture
            self.dit_graphs = DiTStepGraphs(pool, stream, capture_fn=graph_capture)
            self.vocoder_graphs = VocoderGraphs(vocoder, pool, stream, capture_fn=graph_capture)
        self.flow = FlowMatcher(dit, self.buckets, self.dit_graphs)
        self.cost = CostEstimate()
        # On the CPU one mel per vocoder call: batching gains nothing without parallel hardware,
        # and a batch's activations outgrow the caches.
        rows = self.buckets.batch_sizes if on_cuda or bucketed else (1,)
        self.vocoders = VocoderBatcher(vocoder, rows, bucketed, self.vocoder_graphs)

    @classmethod
    def load(
        cls,
        paths: CheckpointPaths,
        device: torch.device | str,
        dtype: torch.dtype,
        detok_cfg: DetokConfig,
        weights: str = "bf16",
    ) -> Detokenizer:
        """`weights`: the resolved [detok] weights (bf16 = the DiT in `dtype`; fp8 / int8 quantize it)."""
        device = torch.device(device)
        dit = load_dit(paths.detokenizer, device, dtype, weights)  # placed block by block, quantized as it goes
        vocoder = load_vocoder(paths.vocoder, device, dtype)
        if vocoder.cfg.num_mels != dit.cfg.input_size:
            raise CheckpointError(
                f"{paths.vocoder / 'config.json'}: num_mels {vocoder.cfg.num_mels} "
                f"!= DiT input_size {dit.cfg.input_size}"
            )
        mel = VocoderMel.from_vocoder_config(paths.vocoder / "config.json")
        if mel.num_mels != dit.cfg.input_size or mel.hop_size != vocoder.cfg.hop_size:
            raise CheckpointError(
                f"{paths.vocoder / 'config.json'}: num_mels/hop_size {mel.num_mels}/{mel.hop_size} "
                f"differ from the models' {dit.cfg.input_size}/{vocoder.cfg.hop_size}"
            )
        return cls(dit, vocoder, detok_cfg, mel=mel)

    @property
    def sample_rate(self) -> int:
        return self.vocoder.cfg.sampling_rate

    @property
    def samples_per_token(self) -> int:
        """Output samples per semantic token (4 mel frames x hop: 1920 at 24 kHz)."""
        return UPSAMPLE * self.vocoder.cfg.hop_size

    @torch.inference_mode()
    def prepare_for_serving(self) -> dict:
        """Capture the CUDA graphs of every shape a stream is planned to produce: the DiT step
        of each bucket, the vocoder of each (rows, mel length). Call once before serving, on
        the detokenizer worker thread with its CUDA stream current (graphs replay there);
        shapes not planned (e.g. final chunks' vocoder lengths) are captured when first met.
        Without CUDA graphs (the CPU, or detok.cuda_graphs = false) it does nothing.
        Returns the graphs it holds, how many of them this call captured (the others an
        earlier call's), how long it took and the device memory it added."""
        info = dict(
            cuda_graphs=self.uses_graphs,
            dit_graphs=0,
            vocoder_graphs=0,
            new_graphs=0,
            seconds=0.0,
            added_bytes=0,
            static_buffer_bytes=self.flow.arena.nbytes,
        )
        dit_graphs, vocoder_graphs = self.dit_graphs, self.vocoder_graphs
        if dit_graphs is None or vocoder_graphs is None:
            return info
        on_cuda = self.device.type == "cuda"
        if on_cuda:  # the buffers were zeroed on the loading thread's stream: let that finish first
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # the baseline without a cache
        start, before = time.perf_counter(), torch.cuda.memory_reserved(self.device) if on_cuda else 0
        held = len(dit_graphs.cache) + len(vocoder_graphs.cache)
        stream = rehearse(self._params(self.schedule))
        for shape in self.buckets.serving_shapes([(c.frames, c.prefix) for c in stream]):
            batch = self.flow.batch(shape)
            batch.load([])  # harmless inputs (padded rows: zeros, all keys valid) for the warm-up calls
            dit_graphs.capture(batch)
        lengths = sorted({c.vocoder_frames for c in stream})
        # room for the planned shapes and as many more (final chunks' lengths) before any is dropped
        planned = len(lengths) * len(self.buckets.batch_sizes)
        vocoder_graphs.cache.capacity = max(vocoder_graphs.cache.capacity, 2 * planned)
        for length in lengths:
            for rows in self.buckets.batch_sizes:
                vocoder_graphs.capture((rows, self.dit.cfg.input_size, length))
        if on_cuda:
            torch.cuda.current_stream(self.device).synchronize()
            torch.cuda.empty_cache()  # the warm-up calls' memory, cached for the capture stream
            info.update(added_bytes=torch.cuda.memory_reserved(self.device) - before)
        info.update(
            dit_graphs=len(dit_graphs.cache),
            vocoder_graphs=len(vocoder_graphs.cache),
            new_graphs=len(dit_graphs.cache) + len(vocoder_graphs.cache) - held,
            seconds=time.perf_counter() - start,
            static_buffer_bytes=self.flow.arena.nbytes,
        )
        return info

    def _max_position(self) -> int:
        cfg = self.dit.cfg
        limit = MAX_POSITION
        if cfg.use_rope:
            limit = min(limit, cfg.rope_max_positions, cfg.max_seq_len)
        if cfg.position_embedding_type == "learnable":
            limit = min(limit, cfg.max_seq_len + 1)
        return limit

    def _params(self, schedule: ChunkSchedule) -> StreamParams:
        return StreamParams(
            schedule=schedule,
            mel_bins=self.dit.cfg.input_size,
            hop_size=self.vocoder.cfg.hop_size,
            sample_rate=self.vocoder.cfg.sampling_rate,
            vocab_size=self.dit.cfg.semantic_vocab_size,
            max_position=self._max_position(),
        )

    def new_stream(
        self, seed: int | None = None, noise_fn: Callable[[int], Tensor] | None = None, voice: VoicePrefix | None = None
    ) -> DetokStream:
        """The streaming state of one answer's speech (in `voice`, or the model's own); its CPU
        generator (seeded) draws each chunk's noise."""
        return DetokStream(self._params(self.schedule), seed, noise_fn, voice)

    @property
    def num_prefill_calls(self) -> int:
        """DiT calls spent on voice prompts so far (each voice_prefix adds its spans)."""
        return self.flow.num_prefill_calls

    @torch.inference_mode()
    def voice_prefix(
        self, wav: Tensor, codes: Sequence[int] | Tensor, max_prompt_chunks: int = MAX_PROMPT_CHUNKS
    ) -> VoicePrefix:
        """The DiT prefix of a reference voice: `wav` float32 [samples] at the vocoder's rate,
        `codes` its 12.5 Hz semantic codes (the GLM-4 tokenizer's, no offset)."""
        if self.mel is None:
            raise KimiAudioError("this detokenizer was built without the vocoder's mel settings (use Detokenizer.load)")
        longest = max(self.schedule.frames(i) for i in range(self.schedule.num_growing_chunks() + 1))
        codes = voice_codes(codes, self.dit.cfg.semantic_vocab_size, longest, self._max_position())
        return build_voice_prefix(self.flow, self.mel(wav), codes, self.schedule.max_kv_cache_frames, max_prompt_chunks)

    def detokenize(
        self,
        tokens: Sequence[int] | Tensor,
        seed: int | None = None,
        noise_fn: Callable[[int], Tensor] | None = None,
        trace: list | None = None,
        preset: str | None = None,
        voice: VoicePrefix | None = None,
    ) -> Tensor:
        """All tokens -> float32 wav [n_tokens * 4 * hop] on the CPU, chunked as a stream with
        the same seed would be (`preset="official"`: the official detokenize_audio whatever the
        config says)."""
        tokens = tokens.reshape(-1).tolist() if isinstance(tokens, Tensor) else list(tokens)
        schedule = self.schedule
        if preset is not None:
            schedule = ChunkSchedule.from_config(replace(self.cfg, preset=preset), self._max_position())
        stream = DetokStream(self._params(schedule), seed, noise_fn, voice)
        stream.trace = trace
        return self.step_batch([(stream, tokens, True)])[0]

    def state_bytes_per_stream(self) -> int:
        """Device memory one stream holds at most: its prefix K/V at the cap, and the vocoder
        overlap (held mel and wav; at most a chunk's worth, the largest chunk counted)."""
        cfg, element = self.dit.cfg, self.dit.input_linear.weight.element_size()
        kv = cfg.depth * 2 * cfg.hidden_size * self.schedule.max_kv_cache_frames * element
        frames = max(self.buckets.frame_sizes)
        return kv + frames * (cfg.input_size + self.vocoder.cfg.hop_size) * element

    @property
    def guard_settings(self) -> GuardSettings:
        """What the real-time guard (realtime_guard.plan_chunks) needs from the config."""
        s = self.schedule
        return GuardSettings(
            self.cfg.max_batch_sessions,
            self.cfg.run_ahead_s,
            s.first_ode_steps,
            s.ode_steps,
            s.min_ode_steps,
            s.lower_first_chunk,
        )

    @torch.inference_mode()
    def step_batch(
        self, items: Sequence[DetokItem | tuple[DetokStream, list[int], bool]], rounds: int | None = None
    ) -> list[Tensor]:
        """Push each stream's new tokens and run every chunk now due (all of them when final),
        or at most `rounds` chunks per stream (the serving loop runs one: a stream with more
        due goes back to the queue, and its later chunks never hold a batch's other chunks
        back). Items are DetokItems or (stream, tokens, final) tuples.

        Returns per item the float32 CPU wav produced now (empty when no chunk was due). Also
        feeds `self.cost` (seconds per DiT call, for the guard's forecasts)."""
        batch = [item if isinstance(item, DetokItem) else DetokItem(*item) for item in items]
        if len({id(item.stream) for item in batch}) != len(batch):
            raise KimiAudioError("step_batch: a stream appears twice in one call")
        start, calls = time.perf_counter(), self.flow.num_calls
        for item in batch:
            item.stream.push(item.tokens)
        pieces: list[list[Tensor]] = [[] for _ in batch]
        for _ in itertools.count() if rounds is None else range(rounds):
            due = [i for i, item in enumerate(batch) if item.stream.ready(item.final)]
            if not due:
                break
            jobs = [batch[i].stream.next_job(batch[i].final, batch[i].ode_steps) for i in due]
            outs = self.flow.infer_chunks(jobs)
            mels = [batch[i].stream.finish_dit(out) for i, out in zip(due, outs)]
            for i, wav in zip(due, self.vocoders.vocode(mels)):
                pieces[i].append(batch[i].stream.finish_vocoder(wav))
        # one device->host copy for the whole step (it also waits for the work: the time is real)
        flat = [torch.cat(p) if p else torch.zeros(0, device=self.device) for p in pieces]
        sizes = [w.numel() for w in flat]
        host = torch.cat(flat).float().cpu() if flat else torch.zeros(0)
        self.cost.observe(time.perf_counter() - start, self.flow.num_calls - calls)
        return list(torch.split(host, sizes))


@dataclass
class DetokItem:
    """One stream's part in a step_batch call."""

    stream: DetokStream
    tokens: list[int]  # new tokens to push (may be empty)
    final: bool  # no more tokens will come: flush every chunk left
    ode_steps: int | None = None  # the real-time guard's step count for the chunks run now; None = the schedule's
