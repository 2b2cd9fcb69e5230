"""Voice prefixes kept on the device: an LRU within a byte budget, owned by the detokenizer worker.

A voice's DiT prefix (detok/voice_prefix.py) is computed the first time a turn (or adding the
voice) needs it and then shared by every stream in that voice. When the prefixes outgrow
voices.cache_mib the least recently used ones are dropped; a later turn in such a voice
recomputes its prefix from the voice's stored inputs (the registry holds them). The newest
prefix is kept even alone over the budget: a turn always gets its voice. No torch here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kimiaudio.detok.voice_prefix import VoicePrefix
from kimiaudio.pipeline.voice_registry import Voice


class VoiceBank:
    def __init__(self, build: Callable[[Voice], VoicePrefix], budget_bytes: int):
        self._build = build  # Voice -> VoicePrefix (runs the DiT)
        self.budget_bytes = budget_bytes
        self._prefixes: OrderedDict[str, VoicePrefix] = OrderedDict()  # voice key -> VoicePrefix, oldest use first
        self.num_built = 0  # prefixes computed so far (a recomputation after eviction counts again)
        self.num_evicted = 0

    @property
    def num_cached(self) -> int:
        return len(self._prefixes)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._prefixes.values())

    def prefix(self, voice: Voice) -> VoicePrefix:
        """The voice's prefix, computed now unless cached."""
        found = self._prefixes.get(voice.key)
        if found is not None:
            self._prefixes.move_to_end(voice.key)
            return found
        built = self._build(voice)
        self.num_built += 1
        self._prefixes[voice.key] = built
        while len(self._prefixes) > 1 and self.nbytes > self.budget_bytes:
            self._prefixes.popitem(last=False)
            self.num_evicted += 1
        return built

    def forget(self, key: str) -> None:
        """Drop a deleted voice's prefix (streams still speaking in it keep their reference)."""
        self._prefixes.pop(key, None)
