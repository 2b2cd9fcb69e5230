"""One request inside the engine: its two token streams, KV bookkeeping and outcome.

Follows nano-vllm's `Sequence`, widened to Kimi-Audio's input: every position carries an
audio id and a text id (the two parallel streams), a `use_text` flag (the official embedding
skips the text embedding of a forward call whose text ids sum to 0; storing the decision per
position keeps results independent of how the engine chunks and batches), a continuous flag
and a digest of the continuous feature row placed there (None elsewhere). The prefix cache
hashes blocks of these per-position keys, so two prompts share KV only when both streams,
the flags and the features agree.

Built whole by the engine from a validated request (PromptPositions, its generation rules,
sampling params and random stream). No torch at run time: the feature tensor and the params'
types are imported for type checking only. The engine API's values are in request.py and step_output.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING

from kimiaudio.engine.request import RequestError

if TYPE_CHECKING:
    import torch

    from kimiaudio.engine.sampling_params import RequestRandom, SamplingParams
    from kimiaudio.engine.stop_rules import StreamRules


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


# The host's id at a position whose sampled ids are not read yet (never fed to the model).
UNRESOLVED = -1

# One position's cache key: (audio id, text id, use_text, feature digest or None).
PositionKey = tuple[int, int, bool, "str | None"]


@dataclass(frozen=True)
class PromptPositions:
    """A prompt, one entry per position in every list."""

    audio_ids: list[int]
    text_ids: list[int]
    use_text: list[bool]
    continuous_mask: list[bool]
    feature_digests: list[str | None]  # of the feature row placed at a continuous position

    def __len__(self) -> int:
        return len(self.audio_ids)


class Sequence:
    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt: PromptPositions,
        *,
        block_size: int,
        max_num_tokens: int,
        priority: int,
        rules: StreamRules,
        params: SamplingParams,
        random: RequestRandom,
        features: torch.Tensor | None = None,
    ):
        """max_num_tokens: positions whose K/V may ever be needed (prompt + generated steps
        but the last); priority: request.py's ANSWER_PRIORITY / BACKGROUND_PRIORITY; features
        [N, adaptor_dim] on the model's device: the rows of the N continuous positions."""
        n = len(prompt)
        lengths = (len(prompt.text_ids), len(prompt.use_text), len(prompt.continuous_mask), len(prompt.feature_digests))
        if any(length != n for length in lengths):
            raise RequestError(f"request {request_id}: per-position lists differ in length ({n}, {lengths})")
        self.seq_id = seq_id
        self.request_id = request_id
        self.block_size = block_size
        self.audio_ids = list(prompt.audio_ids)
        self.text_ids = list(prompt.text_ids)
        self.use_text = list(prompt.use_text)
        self.continuous_mask = list(prompt.continuous_mask)
        self.feature_digests = list(prompt.feature_digests)
        self.feature_rows: list[int] = _feature_rows(self.continuous_mask)
        self.features = features
        self.num_prompt_tokens = n
        self.max_num_tokens = max_num_tokens
        self.priority = priority
        self.rules = rules
        self.params = params
        self.random = random
        self.status = SequenceStatus.WAITING
        # KV bookkeeping: positions [0, num_computed_tokens) have K/V in the pool.
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.num_hashed_blocks = 0  # leading blocks of block_table registered in the prefix cache
        self.num_cached_tokens = 0  # positions served from the prefix cache at the last admission
        self.block_hashes: list[bytes] = []  # chained hashes of the leading full blocks (block_manager.py)
        self.is_prefilling = True  # from admission until its first sample after admission
        self.num_unresolved = 0  # trailing positions whose ids are still on the device
        self.finish_reason: str | None = None
        self.error: str | None = None

    def __len__(self) -> int:
        return len(self.audio_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.audio_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Positions still to compute before the next token can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def is_awaiting_first_audio(self) -> bool:
        """A spoken answer none of whose audio exists yet: its listener hears silence until it
        does (the scheduler serves its prefill before any other of its priority)."""
        return self.rules.is_awaiting_audio

    @property
    def num_generated_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def generated_text_ids(self) -> list[int]:
        return self.text_ids[self.num_prompt_tokens :]

    @property
    def generated_audio_ids(self) -> list[int]:
        return self.audio_ids[self.num_prompt_tokens :]

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_key(self, index: int) -> tuple[PositionKey, ...]:
        """The cache key of full block `index`: one PositionKey per position in it."""
        start, end = index * self.block_size, (index + 1) * self.block_size
        return tuple(
            zip(
                self.audio_ids[start:end],
                self.text_ids[start:end],
                self.use_text[start:end],
                self.feature_digests[start:end],
            )
        )

    @property
    def num_settled_tokens(self) -> int:
        """Computed positions whose ids the host knows: what the prefix cache may key."""
        return min(self.num_computed_tokens, self.num_tokens - self.num_unresolved)

    def append_unresolved(self) -> None:
        """A launched step samples this sequence's next tokens: their position exists (the
        next step may compute it, reading the ids from the samples on the device) but its ids
        are known on the host only when the samples are read (`resolve`)."""
        self.append_token(UNRESOLVED, UNRESOLVED)
        self.num_unresolved += 1

    def resolve(self, text_token: int, audio_token: int) -> None:
        """The oldest unresolved position's ids, as the generation rules fed them back."""
        if self.num_unresolved == 0:
            raise RuntimeError(f"sequence {self.seq_id}: no unresolved position")
        position = self.num_tokens - self.num_unresolved
        self.text_ids[position], self.audio_ids[position] = text_token, audio_token
        self.use_text[position] = text_token != 0
        self.num_unresolved -= 1

    def append_token(self, text_token: int, audio_token: int) -> None:
        """Feed back one generated step: both tokens at the next position, no features."""
        self.text_ids.append(text_token)
        self.audio_ids.append(audio_token)
        self.use_text.append(text_token != 0)  # the reference decode call's `text ids sum != 0`
        self.continuous_mask.append(False)
        self.feature_digests.append(None)
        self.feature_rows.append(-1)


def _feature_rows(continuous_mask: list[bool]) -> list[int]:
    """Per position: the row of the request's feature tensor placed there, or -1."""
    rows, row = [], 0
    for flag in continuous_mask:
        rows.append(row if flag else -1)
        row += bool(flag)
    return rows
