"""Recently encoded utterances by content: a follow-up turn's history is not encoded again.

Keys are a hash of the 16 kHz samples; values are (VQ codes, Whisper features on the host).
Features stay on the host: 512 utterances' [T, 5120] features would otherwise grow on the
GPU outside the KV pool's budget (up to ~8 GB in bf16 at the input limit); the engine copies
a prompt's features to the device once, at admission. LRU and bounded: a turn being admitted
holds its own references (see lm_turn.LmTurn), so eviction never takes what a batch
in flight still needs.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch

Encoded = tuple[list[int], torch.Tensor]  # (codes without offset, features [T, adaptor_dim])


def audio_key(pcm: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(pcm, dtype=np.float32).tobytes(), digest_size=16).digest()


class EncodeCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[bytes, Encoded] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Encoded | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: Encoded) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
