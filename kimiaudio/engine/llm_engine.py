"""The synchronous engine: requests in, one (text, audio) token pair per request per step out.

Follows nano-vllm's LLMEngine: `add_request` turns a validated EngineRequest into a
Sequence, `step` = schedule, run the model, apply each request's official generation rules
(stop_rules.StreamRules) to its samples, feed the tokens back, free finished sequences.
A bad request fails alone (RequestError from add_request); a step that raises fails only the
sequences it ran. Each StepOutput carries what callers need (see engine/step_output.py), so they
never read the engine's sequences or block manager. Not thread-safe: one owner thread (the
pipeline's LM worker).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from dataclasses import dataclass

import torch

from kimiaudio.config import EngineConfig
from kimiaudio.engine.block_manager import BlockManager
from kimiaudio.engine.model_runner import ModelRunner
from kimiaudio.engine.request import (
    ANSWER_PRIORITY,
    BACKGROUND_PRIORITY,
    EngineRequest,
    PromptTooLongError,
    RequestError,
)
from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
from kimiaudio.engine.scheduler import Scheduler
from kimiaudio.engine.sequence import PromptPositions, Sequence, SequenceStatus
from kimiaudio.engine.step_output import Completion, StepOutput
from kimiaudio.engine.stop_rules import RuleTokens, StreamRules, official_max_new_tokens
from kimiaudio.models.kimia_lm import KimiAudioLM
from kimiaudio.text.output_type import check_output_type

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    num_blocks_total: int
    num_blocks_free: int
    num_running: int
    num_waiting: int
    num_prefill_tokens_computed: int  # prompt (and re-prefill) positions run through the model
    num_prefill_tokens_cached: int  # prompt positions served from the prefix cache instead
    num_decode_tokens: int
    num_preemptions: int
    num_steps: int


def feature_digests(features: torch.Tensor) -> list[str]:
    """One digest per feature row [N, D] (over its float32 bytes): the prefix-cache key part."""
    data = features.detach().to("cpu", torch.float32).contiguous().numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=16).hexdigest() for row in data]


class LLMEngine:
    def __init__(
        self,
        lm: KimiAudioLM,
        config: EngineConfig,
        device: torch.device | str,
        dtype: torch.dtype,
        num_blocks: int | None = None,
    ):
        """num_blocks: the KV pool's usable blocks, as the memory plan sized them (ModelRunner)."""
        self.lm = lm
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.runner = ModelRunner(lm, config, self.device, dtype, num_blocks)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size)
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.max_prefill_tokens_while_decoding,
        )
        self.seqs: dict[int, Sequence] = {}
        self._seq_ids = itertools.count()
        self._pending: list[StepOutput] = []  # outputs decided outside a step (e.g. zero-length)
        self._num_prefill_computed = 0
        self._num_decode = 0
        self._num_steps = 0

    def add_request(self, request: EngineRequest) -> int:
        """Validate and queue a request; raises RequestError (for this request only)."""
        seq = self._make_sequence(request)
        if seq.rules.is_finished:  # the length limit allows no step at all
            self._pending.append(self._output(seq, None, None, True, seq.rules.finish_reason))
            return seq.seq_id
        self.scheduler.add(seq)
        self.seqs[seq.seq_id] = seq
        return seq.seq_id

    def abort(self, seq_id: int) -> bool:
        """Stop a request and free its KV blocks now; False if it is not (or no longer) live."""
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        seq.finish_reason = "abort"
        return True

    def has_work(self) -> bool:
        return bool(self._pending) or self.scheduler.has_work

    def release(self) -> None:
        """Give the KV pool and the decode graphs' memory back, once no step will run again
        (a stopped pipeline): a pipeline built next in the same process plans without them."""
        self.runner.release()

    def step(self) -> list[StepOutput]:
        outputs, self._pending = self._pending, []
        plan = self.scheduler.schedule()
        if not plan:
            return outputs
        self._num_steps += 1
        self._num_prefill_computed += plan.num_prefill_tokens
        self._num_decode += plan.num_tokens - plan.num_prefill_tokens
        try:
            samples = self.runner.run(plan)
        except Exception as exc:  # a broken step fails the requests in it, not the server
            log.exception("engine step failed")
            for seq in plan.seqs:
                outputs.append(self._fail(seq, f"engine step failed: {type(exc).__name__}: {exc}"))
            return outputs
        for seq, sampled in zip(self.scheduler.postprocess(plan), samples):
            text, audio, finished, reason = seq.rules.step(sampled.text, sampled.audio)
            seq.append_token(text, audio)
            if finished:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
                del self.seqs[seq.seq_id]
            output = self._output(seq, text, audio, finished, reason)
            if text == sampled.text:  # the sampled token itself, not one the rules forced
                output.text_logprob, output.text_top = sampled.text_logprob, sampled.text_top
            outputs.append(output)
        return outputs

    def stats(self) -> EngineStats:
        return EngineStats(
            num_blocks_total=self.block_manager.num_blocks,
            num_blocks_free=self.block_manager.num_free_blocks,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_prefill_tokens_computed=self._num_prefill_computed,
            num_prefill_tokens_cached=self.scheduler.num_cached_prefill_tokens,
            num_decode_tokens=self._num_decode,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self._num_steps,
        )

    def _fail(self, seq: Sequence, error: str) -> StepOutput:
        self.seqs.pop(seq.seq_id, None)
        if seq.status != SequenceStatus.FINISHED:
            self.scheduler.abort(seq)
        seq.finish_reason, seq.error = "error", error
        return self._output(seq, None, None, True, "error", error)

    @staticmethod
    def _output(
        seq: Sequence, text: int | None, audio: int | None, finished: bool, reason: str | None, error: str | None = None
    ) -> StepOutput:
        completion = None
        if finished and error is None:
            rules = seq.rules
            completion = Completion(rules.text_tokens, rules.audio_tokens, rules.num_steps)
        return StepOutput(
            seq.request_id,
            seq.seq_id,
            text,
            audio,
            finished,
            reason,
            error,
            seq.num_prompt_tokens,
            seq.num_cached_tokens,
            completion,
        )

    def _make_sequence(self, request: EngineRequest) -> Sequence:
        rid, prompt = request.request_id, request.prompt
        n = len(prompt.audio_ids)
        if n == 0:
            raise RequestError(f"request {rid}: empty prompt")
        if len(prompt.text_ids) != n or len(prompt.continuous_mask) != n:
            raise RequestError(
                f"request {rid}: audio_ids, text_ids and continuous_mask must have one entry per "
                f"position (got {n}, {len(prompt.text_ids)}, {len(prompt.continuous_mask)})"
            )
        check_output_type(request.output_type, f"request {rid}: output_type", RequestError)
        if not isinstance(request.params, SamplingParams):
            raise RequestError(f"request {rid}: params must be a SamplingParams")
        vocab = self.lm.config.vocab_size
        for name, ids in (("audio_ids", prompt.audio_ids), ("text_ids", prompt.text_ids)):
            if any(not 0 <= int(t) < vocab for t in ids):
                raise RequestError(f"request {rid}: {name} must lie in [0, {vocab})")
        if n > self.config.max_model_len:
            raise PromptTooLongError(
                f"request {rid}: prompt of {n} positions exceeds engine.max_model_len ({self.config.max_model_len})"
            )
        mask = [bool(m) for m in prompt.continuous_mask]
        features = self._check_features(rid, prompt.features, sum(mask))
        if features is None:
            mask = [False] * n  # nothing to add at those positions: plain embeddings, as the reference
        digests: list[str | None] = [None] * n
        if features is not None:
            rows = iter(feature_digests(features))
            digests = [next(rows) if m else None for m in mask]
        audio_ids = [int(t) for t in prompt.audio_ids]
        text_ids = [int(t) for t in prompt.text_ids]
        use_text = [sum(text_ids) != 0] * n  # the reference prefill: one decision for the prompt
        limit = official_max_new_tokens(request.output_type, n, request.params.max_new_tokens)
        limit = min(limit, self.config.max_model_len - n + 1)  # the last sample's position needs no K/V
        try:
            tokens = RuleTokens.from_specials(request.specials)
        except (AttributeError, TypeError, ValueError) as exc:
            raise RequestError(f"request {rid}: specials lack a generation-rule token id ({exc})") from None
        if not isinstance(request.priority, int) or request.priority not in (ANSWER_PRIORITY, BACKGROUND_PRIORITY):
            raise RequestError(
                f"request {rid}: priority must be {ANSWER_PRIORITY} (an answer) or "
                f"{BACKGROUND_PRIORITY} (background), got {request.priority!r}"
            )
        delay = self.lm.config.kimia_mimo_audiodelaytokens
        return Sequence(
            next(self._seq_ids),
            rid,
            PromptPositions(audio_ids, text_ids, use_text, mask, digests),
            block_size=self.config.block_size,
            max_num_tokens=n + max(limit, 1) - 1,
            priority=request.priority,
            rules=StreamRules(request.output_type, tokens, delay, limit, request.params.ignore_eos),
            params=request.params,
            random=RequestRandom(request.params.seed),
            features=None if features is None else features.to(self.device, self.dtype),
        )

    def _check_features(self, rid: str, features, num_continuous: int) -> torch.Tensor | None:
        """None, a [N, D] / [1, N, D] tensor or a list of them -> [N, D] or None, validated."""
        if features is None or not self.lm.config.use_whisper_feature:
            return None  # official: a checkpoint without the VQ adaptor ignores the features
        parts = [features] if isinstance(features, torch.Tensor) else list(features)
        if not parts:
            return None
        if any(not isinstance(p, torch.Tensor) or not p.is_floating_point() for p in parts):
            raise RequestError(f"request {rid}: features must be float tensors")
        dim = self.lm.config.kimia_adaptor_input_dim
        if any(p.dim() not in (2, 3) or p.shape[-1] != dim or (p.dim() == 3 and p.shape[0] != 1) for p in parts):
            raise RequestError(
                f"request {rid}: features must be [N, {dim}] tensors, got {[tuple(p.shape) for p in parts]}"
            )
        rows = torch.cat([p.reshape(-1, dim) for p in parts])
        if rows.shape[0] != num_continuous:
            raise RequestError(f"request {rid}: {rows.shape[0]} feature rows for {num_continuous} continuous positions")
        return rows
