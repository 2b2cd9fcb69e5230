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
from the CUDA graph captured for that size, which also samples the rows whose settings allow
it (graph_sampling.py: the host sampler then has nothing to do). With CUDA graphs, a mixed
step (prefill chunks beside decodes) whose tokens fit the largest bucket of mixed_batch.py is
padded to its bucket and replayed from that bucket's graph. Every other step runs eagerly
over a flat batch built for it.

A step whose sampling sequences all have settings the device sampler computes (`can_launch`)
may instead be launched: `launch` queues it (the same static or flat paths, sampled on the
device: in the decode graph, or after the mixed step's logits), taking any ids still
unresolved from the previous launched step's samples on the device, and returns a
LaunchedStep that the engine reads later (launched_step.py): its one synchronisation then
waits for that step only.
"""

from __future__ import annotations

import logging

import torch

from kimiaudio.audio.device_result import to_device
from kimiaudio.config import EngineConfig
from kimiaudio.engine.decode_batch import DecodeBatch, DecodeInputs, decode_batch_sizes
from kimiaudio.engine.flat_step import FlatStep
from kimiaudio.engine.graph_sampling import GraphSampling, in_graph
from kimiaudio.engine.kv_pool import KVPool, pool_num_blocks
from kimiaudio.engine.launched_step import LaunchedStep, StepSample, read_samples, take_sampled
from kimiaudio.engine.mixed_batch import MixedBatch, MixedInputs, mixed_token_buckets
from kimiaudio.engine.paged_attention import AttentionMetadata, PagedAttention, attention_kernel_supports
from kimiaudio.engine.sequence import Sequence
from kimiaudio.engine.step_graphs import StepGraphs
from kimiaudio.engine.step_plan import StepPlan
from kimiaudio.errors import ConfigError
from kimiaudio.layers.gemm_tuning import tune_linears
from kimiaudio.layers.sampler import sample
from kimiaudio.layers.triton_support import use_triton
from kimiaudio.models.kimia_lm import KimiAudioLM

log = logging.getLogger(__name__)


def graph_shapes(config: EngineConfig) -> tuple[int, list[int], list[int]]:
    """(rows of the static decode and mixed batches, the decode batch sizes, the mixed steps'
    token buckets): the shapes captured when CUDA graphs are on (the memory plan counts them)."""
    max_batch = min(config.max_num_seqs, config.max_num_batched_tokens)
    max_tokens = min(config.max_num_batched_tokens, max_batch + config.max_prefill_tokens_while_decoding)
    return max_batch, decode_batch_sizes(max_batch), mixed_token_buckets(max_tokens)


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
        max_batch, decode_sizes, buckets = graph_shapes(engine_config)
        sizes = decode_sizes if use_graphs else None
        # The decode GEMMs' tiles, measured for the batch sizes served (before any capture).
        self.gemm_tiles = tune_linears(lm, decode_sizes, dtype) if use_triton(self.device) else []
        if engine_config.overlap_steps and use_triton(self.device):
            from kimiaudio.engine.triton_take_sampled import warm_up

            warm_up(self.device)  # compiled now, not in the first launched step that needs it
        with torch.inference_mode():
            self.decode_inputs = DecodeInputs(
                self.pool, max_batch, engine_config.max_model_len, dtype, self.use_kernels, sizes
            )
        self.graph_sampling = GraphSampling(max_batch, self.device)
        self.overlap_steps = engine_config.overlap_steps
        self.graphs: StepGraphs | None = None
        if use_graphs and sizes is not None:
            inputs = self.decode_inputs

            def decode_and_sample(size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                text_logits, audio_logits = self.decode_forward(inputs.batch(size, inputs.max_blocks))
                return text_logits, audio_logits, self.graph_sampling.sample(text_logits, audio_logits)

            self.graphs = StepGraphs(decode_and_sample, sizes, self.device)
            self.graphs.capture()
        # Mixed steps from graphs: their attention is the prefill kernel over the static runs.
        self.mixed_inputs: MixedInputs | None = None
        self.mixed_graphs: StepGraphs | None = None
        if use_graphs and engine_config.mixed_cuda_graphs:
            with torch.inference_mode():
                mixed = MixedInputs(
                    self.pool, max_batch, buckets, engine_config.max_model_len, cfg.kimia_adaptor_input_dim, dtype, True
                )
            self.mixed_inputs = mixed
            self.mixed_graphs = StepGraphs(
                lambda size: self.mixed_forward(mixed.batch(size)), buckets, self.device, "mixed step"
            )
            self.mixed_graphs.capture()

    def release(self) -> None:
        """Drop the KV pool, the static buffers and the graphs (their device memory goes back
        to the allocator): the engine is done, and the next one's pool is sized without them."""
        self.graphs = self.mixed_graphs = None
        self.mixed_inputs = None
        del self.decode_inputs, self.pool  # no step runs again: nothing may reach for them

    @property
    def capture_seconds(self) -> float:
        return sum(g.capture_seconds for g in (self.graphs, self.mixed_graphs) if g is not None)

    @property
    def graph_memory_bytes(self) -> int:
        return sum(g.memory_bytes for g in (self.graphs, self.mixed_graphs) if g is not None)

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> list[StepSample]:
        """Compute every scheduled position; return (text, audio, text logprob, text top
        alternatives) samples, one per sequence that completes its pending positions this
        step, in batch order."""
        if self.decode_inputs.fits(plan):
            return self._run_decode(plan.seqs)
        text_logits, audio_logits, sampling = self._mixed_logits(plan, None)
        if not sampling:
            return []
        return self._sample(sampling, text_logits[: len(sampling)], audio_logits[: len(sampling)])

    def can_launch(self, plan: StepPlan) -> bool:
        """Whether `launch` runs this step: overlap on, and every sequence that samples in it
        (one at least) has settings the device sampler computes."""
        sampling = [seq for seq, count in plan if seq.num_computed_tokens + count == seq.num_tokens]
        return self.overlap_steps and bool(sampling) and in_graph(sampling)

    @torch.inference_mode()
    def launch(self, plan: StepPlan, previous: LaunchedStep | None) -> LaunchedStep:
        """Queue the step (a `can_launch` one) without waiting for it: its ids still unresolved
        come from `previous`'s samples on the device, its own samples stay there until read."""
        seqs = plan.seqs
        if self.decode_inputs.fits(plan) and all(seq.num_computed_tokens + 1 == seq.num_tokens for seq in seqs):
            padded, width = self.decode_inputs.prepare(seqs, previous)
            self.graph_sampling.write(seqs, list(range(len(seqs))), padded)
            if self.graphs is not None:
                _, _, samples = self.graphs.replay(padded)
            else:
                samples = self.graph_sampling.sample(*self.decode_forward(self.decode_inputs.batch(padded, width)))
            return LaunchedStep(seqs, samples)
        text_logits, audio_logits, sampling = self._mixed_logits(plan, previous)
        n = len(sampling)
        self.graph_sampling.write(sampling, list(range(n)), n)
        return LaunchedStep(sampling, self.graph_sampling.sample(text_logits[:n], audio_logits[:n]))

    def _run_decode(self, seqs: list[Sequence]) -> list[StepSample]:
        padded, width = self.decode_inputs.prepare(seqs)
        sampling = [i for i, seq in enumerate(seqs) if seq.num_computed_tokens + 1 == seq.num_tokens]
        if self.graphs is not None:
            sampled_in_graph = bool(sampling) and in_graph([seqs[i] for i in sampling])
            if sampled_in_graph:
                self.graph_sampling.write(seqs, sampling, padded)
            text_logits, audio_logits, samples = self.graphs.replay(padded)  # [Bp, V] each
            if sampled_in_graph:
                return read_samples(samples, sampling)
        else:
            text_logits, audio_logits = self.decode_forward(self.decode_inputs.batch(padded, width))
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

    def mixed_forward(self, batch: MixedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The mixed forward over static views: no host-device synchronisation, no shape that
        depends on the data (what a CUDA graph captures). -> logits [S, V] of both heads, row k
        the k-th sampling sequence's."""
        hidden = self.lm.embed(
            batch.audio_ids, batch.text_ids, batch.use_text != 0, batch.features, continuous=batch.continuous != 0
        )
        return self.lm(hidden, batch.positions, batch.attention, batch.logits_rows)

    def _mixed_logits(
        self, plan: StepPlan, previous: LaunchedStep | None
    ) -> tuple[torch.Tensor, torch.Tensor, list[Sequence]]:
        """A step the static decode batch does not take: through the mixed step's buffers (and
        its graph) when it fits them, else over a flat batch built for it; ids still unresolved
        come from `previous`'s samples on the device. -> both heads' logits, row k the k-th
        sampling sequence's (rows past them: padding), and those sequences in batch order."""
        inputs = self.mixed_inputs
        if inputs is not None and inputs.fits(plan):
            bucket, sampling = inputs.prepare(plan, previous)
            if self.mixed_graphs is not None:
                text_logits, audio_logits = self.mixed_graphs.replay(bucket)  # [S, V] each
            else:
                text_logits, audio_logits = self.mixed_forward(inputs.batch(bucket))
            return text_logits, audio_logits, sampling
        step = FlatStep.of(plan, previous)
        ids = self._long([step.audio_ids, step.text_ids, [int(u) for u in step.use_text]])
        if previous is not None and step.takes_sampled:
            take_sampled(ids, self._long([step.text_from, step.audio_from]), previous.samples)
        features = step.features
        hidden = self.lm.embed(
            ids[0],
            ids[1],
            ids[2] != 0,
            torch.cat(features) if features else None,
            self._long(step.feature_positions) if features else None,
        )
        meta = AttentionMetadata.build(step.entries, self.block_size, self.device, self.dtype, self.use_kernels)
        attn = PagedAttention(self.pool, meta)
        text_logits, audio_logits = self.lm(hidden, self._long(step.positions), attn, self._long(step.logits_rows))
        return text_logits, audio_logits, step.sampling

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
        top_ids, top_logprobs = out.top_ids, out.top_logprobs
        if out.top_rows and top_ids is not None and top_logprobs is not None:
            parts += [top_ids.double().flatten(), top_logprobs.double().flatten()]
        flat = torch.cat(parts).tolist()  # the step's one host-device synchronisation
        tokens, logprobs, rest = flat[: 2 * n], flat[2 * n : 3 * n], flat[3 * n :]
        top: list[tuple | None] = [None] * n
        if out.top_rows and top_ids is not None:
            width = top_ids.shape[1]
            ids, lps = rest[: len(rest) // 2], rest[len(rest) // 2 :]
            for k, row in enumerate(out.top_rows):
                wanted = seqs[row].params.text_top_logprobs
                top[row] = tuple((int(ids[k * width + j]), lps[k * width + j]) for j in range(wanted))
        return [StepSample(int(tokens[i]), int(tokens[n + i]), logprobs[i], top[i]) for i in range(n)]

    def _long(self, values: list[int] | list[list[int]]) -> torch.Tensor:
        return to_device(torch.tensor(values, dtype=torch.long), self.device)
