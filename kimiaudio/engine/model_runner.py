"""Turns one scheduled step into tensors, runs the LM over the paged KV pool, samples.

Follows nano-vllm's ModelRunner, for Kimi-Audio's two streams: the batch is flat and
token-major (every scheduled sequence's positions concatenated), each position carrying
its audio id, text id, use_text flag and position id; continuous features enter only for
prompt positions computed in this step (rows in position order). Logits are taken only for
the last position of each sequence that completes its pending positions this step; both
heads of the whole batch are sampled in one `sample` call with each request's params,
histories (the tokens fed back so far) and its own uniforms (text, then audio, one pair per
generated step, as the reference loop draws them). The step ends with exactly one
host-device synchronisation: one `.tolist()` of the sampled tokens, the text tokens'
log-probabilities and the alternatives a request asked for (packed in one float64 tensor,
which holds every token id exactly).

An all-decode step (every sequence computes one position without features) takes the
static-shape path: its inputs are written into fixed buffers padded to the next batch size
of decode_batch.py, and the same decode forward runs over them, eagerly or (CUDA) replayed
from the CUDA graph captured for that size. Every other step (prefill chunks, mixed with
decodes or not) runs eagerly over a flat batch built for it.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from kimiaudio.config import EngineConfig
from kimiaudio.engine.cuda_graphs import DecodeGraphs
from kimiaudio.engine.decode_batch import DecodeBatch, DecodeInputs, decode_batch_sizes
from kimiaudio.engine.kv_pool import KVPool, pool_num_blocks
from kimiaudio.engine.paged_attention import AttentionMetadata, PagedAttention, attention_kernel_supports, to_device
from kimiaudio.engine.sequence import Sequence
from kimiaudio.errors import ConfigError
from kimiaudio.layers.sampler import sample
from kimiaudio.layers.triton_support import use_triton
from kimiaudio.models.kimia_lm import KimiAudioLM

log = logging.getLogger(__name__)


class StepSample(NamedTuple):
    """One sequence's samples of a step."""

    text: int
    audio: int
    text_logprob: float  # of the text token, from the sampler's distribution (sampler.py)
    text_top: tuple[tuple[int, float], ...] | None  # the likeliest text tokens, when asked for


class ModelRunner:
    def __init__(
        self,
        lm: KimiAudioLM,
        engine_config: EngineConfig,
        device: torch.device | str,
        dtype: torch.dtype,
        num_blocks: int | None = None,
    ):
        """num_blocks: the KV pool's usable blocks as the memory plan sized it (kv_pool.pool_num_blocks)."""
        self.lm = lm
        self.config = lm.config
        self.device = torch.device(device)
        self.dtype = dtype
        self.block_size = engine_config.block_size
        cfg = self.config
        self.num_blocks = pool_num_blocks(engine_config, num_blocks)
        if self.num_blocks < 1:
            per_block = KVPool.bytes_per_block(
                cfg.num_kv_layers, self.block_size, cfg.num_key_value_heads, cfg.head_dim, dtype
            )
            raise ConfigError(
                f"engine: no room for a KV pool ({per_block} bytes per block of "
                f"{self.block_size} positions); lower engine.block_size or set engine.num_kv_blocks"
            )
        self.pool = KVPool(
            cfg.num_kv_layers,
            self.num_blocks,
            self.block_size,
            cfg.num_key_value_heads,
            cfg.head_dim,
            self.device,
            dtype,
        )
        lm.rotary.ensure_length(engine_config.max_model_len, self.device)
        # The Triton kernels for the pool (store K/V, decode attention): CUDA, or forced.
        self.use_kernels = use_triton(self.device) and attention_kernel_supports(cfg.head_dim)
        # Graphs need a decode attention that reads only a sequence's own blocks through
        # fixed-width tables (the Triton kernel); the torch gather would read them all.
        use_graphs = self.device.type == "cuda" and engine_config.cuda_graphs and self.use_kernels
        if self.device.type == "cuda" and engine_config.cuda_graphs and not use_graphs:
            log.warning("engine.cuda_graphs: no Triton paged attention for this device/model: decoding eagerly")
        max_batch = min(engine_config.max_num_seqs, engine_config.max_num_batched_tokens)
        sizes = decode_batch_sizes(max_batch) if use_graphs else None
        with torch.inference_mode():
            self.decode_inputs = DecodeInputs(
                self.pool, max_batch, engine_config.max_model_len, dtype, self.use_kernels, sizes
            )
        self.graphs: DecodeGraphs | None = None
        if use_graphs:
            inputs = self.decode_inputs
            self.graphs = DecodeGraphs(
                lambda size: self.decode_forward(inputs.batch(size, inputs.max_blocks)), sizes, self.device
            )
            self.graphs.capture()

    def release(self) -> None:
        """Drop the KV pool, the decode buffers and graphs (their device memory goes back to
        the allocator): the engine is done, and the next one's pool is sized without them."""
        self.graphs = None
        self.decode_inputs = None
        self.pool = None

    @property
    def capture_seconds(self) -> float:
        return 0.0 if self.graphs is None else self.graphs.capture_seconds

    @property
    def graph_memory_bytes(self) -> int:
        return 0 if self.graphs is None else self.graphs.memory_bytes

    @torch.inference_mode()
    def run(self, seqs: list[Sequence]) -> list[StepSample]:
        """Compute every scheduled position; return (text, audio, text logprob, text top
        alternatives) samples, one per sequence that completes its pending positions this
        step, in batch order."""
        if self.decode_inputs.fits(seqs):
            return self._run_decode(seqs)
        return self._run_mixed(seqs)

    def _run_decode(self, seqs: list[Sequence]) -> list[StepSample]:
        padded, width = self.decode_inputs.prepare(seqs)
        if self.graphs is not None:
            text_logits, audio_logits = self.graphs.replay(padded)  # [Bp, V] each
        else:
            text_logits, audio_logits = self.decode_forward(self.decode_inputs.batch(padded, width))
        sampling = [i for i, seq in enumerate(seqs) if seq.num_computed_tokens + 1 == seq.num_tokens]
        if not sampling:
            return []
        if len(sampling) == len(seqs):  # the usual case: a slice, no gather
            text_logits, audio_logits = text_logits[: len(seqs)], audio_logits[: len(seqs)]
        else:  # a one-position prefill chunk that does not end its prompt yet
            rows = self._long(sampling)
            text_logits, audio_logits = text_logits[rows], audio_logits[rows]
        return self._sample([seqs[i] for i in sampling], text_logits, audio_logits)

    def decode_forward(self, batch: DecodeBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The all-decode forward over static views: no host-device synchronisation, no shape
        that depends on the data (what a CUDA graph captures). -> logits [Bp, V] of both heads."""
        hidden = self.lm.embed(batch.audio_ids, batch.text_ids, batch.use_text != 0)
        return self.lm(hidden, batch.positions, batch.attention)

    def _run_mixed(self, seqs: list[Sequence]) -> list[StepSample]:
        audio, text, use_text, continuous, positions = [], [], [], [], []
        features: list[torch.Tensor] = []
        entries: list[tuple[list[int], int, int]] = []
        logits_rows: list[int] = []
        sampling: list[Sequence] = []
        for seq in seqs:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + seq.num_scheduled_tokens
            audio += seq.audio_ids[start:end]
            text += seq.text_ids[start:end]
            use_text += seq.use_text[start:end]
            continuous += seq.continuous_mask[start:end]
            positions += range(start, end)
            rows = [r for r in seq.feature_rows[start:end] if r >= 0]
            if rows:  # a sequence's continuous rows are consecutive: slice its feature tensor
                features.append(seq.features[rows[0] : rows[-1] + 1])
            entries.append((seq.block_table, start, end - start))
            if end == seq.num_tokens:
                logits_rows.append(len(audio) - 1)
                sampling.append(seq)

        feature_positions = self._long([i for i, c in enumerate(continuous) if c]) if features else None
        hidden = self.lm.embed(
            self._long(audio),
            self._long(text),
            self._bool(use_text),
            torch.cat(features) if features else None,
            feature_positions,
        )
        attn = PagedAttention(
            self.pool, AttentionMetadata.build(entries, self.block_size, self.device, self.dtype, self.use_kernels)
        )
        text_logits, audio_logits = self.lm(hidden, self._long(positions), attn, self._long(logits_rows))
        if not sampling:
            return []
        return self._sample(sampling, text_logits, audio_logits)

    def _sample(self, seqs: list[Sequence], text_logits: torch.Tensor, audio_logits: torch.Tensor) -> list[StepSample]:
        # Rows 0..B-1 are text, B..2B-1 audio; each row depends only on its own inputs.
        n = len(seqs)
        pairs = [seq.random.next_uniforms() for seq in seqs]  # (text, audio) per sequence
        uniforms = torch.tensor([text for text, _ in pairs] + [audio for _, audio in pairs])  # on the CPU
        params = [seq.params.text for seq in seqs] + [seq.params.audio for seq in seqs]
        histories = [seq.rules.text_history for seq in seqs] + [seq.rules.audio_history for seq in seqs]
        counts = [seq.rules.text_counts for seq in seqs] + [None] * n
        tops = [seq.params.text_top_logprobs for seq in seqs] + [0] * n
        out = sample(torch.cat([text_logits, audio_logits]), params, histories, uniforms, counts, tops)
        parts = [out.tokens.double(), out.logprobs[:n].double()]
        if out.top_rows:
            parts += [out.top_ids.double().flatten(), out.top_logprobs.double().flatten()]
        flat = torch.cat(parts).tolist()  # the step's one host-device synchronisation
        tokens, logprobs, rest = flat[: 2 * n], flat[2 * n : 3 * n], flat[3 * n :]
        top: list[tuple | None] = [None] * n
        if out.top_rows:
            width = out.top_ids.shape[1]
            ids, lps = rest[: len(rest) // 2], rest[len(rest) // 2 :]
            for k, row in enumerate(out.top_rows):
                wanted = seqs[row].params.text_top_logprobs
                top[row] = tuple((int(ids[k * width + j]), lps[k * width + j]) for j in range(wanted))
        return [StepSample(int(tokens[i]), int(tokens[n + i]), logprobs[i], top[i]) for i in range(n)]

    def _long(self, values: list[int]) -> torch.Tensor:
        return to_device(torch.tensor(values, dtype=torch.long), self.device)

    def _bool(self, values: list[bool]) -> torch.Tensor:
        return to_device(torch.tensor(values, dtype=torch.bool), self.device)
