"""Fixed-size KV blocks: allocation, reference counts and the prefix cache (no torch).

Follows nano-vllm's BlockManager. The pool (owned by the model runner) holds `num_blocks`
blocks of `block_size` positions for every trunk and MIMO layer; this class only hands out
block ids. A sequence's `block_table` maps its position p to slot
`block_table[p // block_size] * block_size + p % block_size`.

Prefix cache: once every position of a full block has its K/V computed, the block is
registered under a chained hash of (previous block's hash, this block's per-position keys).
The keys are both token streams, the use_text flag and the continuous feature digest, so a
hit means identical K/V. A sequence's full blocks are hashed once in its life (their
positions never change). A later sequence whose leading blocks hash the same shares them
(reference counts); a hit is checked against the stored keys, so a hash collision is a miss,
never wrong K/V. Freed blocks keep their hash (lazy eviction): they are reused by a later hit
or, least recently freed first, when no never-hashed block is left.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque

from kimiaudio.engine.sequence import PositionKey, Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need a positive number of blocks and block size, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Per block, in flat lists rather than one object each: a GPU pool has tens of
        # thousands of blocks, and every object would be one more for each full garbage
        # collection to scan.
        self.ref_counts = [0] * num_blocks
        self.hashes: list[bytes | None] = [None] * num_blocks
        # The per-position keys each block was hashed from.
        self.keys: list[tuple[PositionKey, ...] | None] = [None] * num_blocks
        self.hash_to_block_id: dict[bytes, int] = {}
        # Free blocks: never-hashed ones first (nothing to lose), then hashed ones in the order
        # they were freed (least recently freed is evicted first).
        self.empty_block_ids: deque[int] = deque(range(num_blocks))
        self.cached_free_ids: OrderedDict[int, None] = OrderedDict()

    @property
    def num_free_blocks(self) -> int:
        return len(self.empty_block_ids) + len(self.cached_free_ids)

    @staticmethod
    def compute_hash(prefix: bytes | None, key: tuple[PositionKey, ...]) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(prefix or b"root")
        h.update(repr(key).encode())  # ints, bools, hex digests and None: a stable repr
        return h.digest()

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Ids of the cached blocks that equal seq's leading full blocks.

        At least one position is always left to compute, so the step that finishes the
        prefill has a last token to take logits from.
        """
        matched: list[int] = []
        num_full = (seq.num_tokens - 1) // self.block_size
        for i, block_hash in enumerate(self.block_hashes(seq, num_full)):
            block_id = self.hash_to_block_id.get(block_hash)
            if block_id is None or self.keys[block_id] != seq.block_key(i):  # miss, or a collision
                break
            matched.append(block_id)
        return matched

    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The chained hashes of seq's first `num_blocks` full blocks. A block's positions never
        change once it is full, so each is hashed once in the sequence's life (kept in
        seq.block_hashes), however often the sequence is matched or preempted."""
        hashes = seq.block_hashes
        prefix = hashes[-1] if hashes else None
        for i in range(len(hashes), num_blocks):
            prefix = self.compute_hash(prefix, seq.block_key(i))
            hashes.append(prefix)
        return hashes[:num_blocks]

    def num_blocks_to_allocate(self, seq: Sequence, matched: list[int]) -> int:
        """Free blocks that allocate(seq, matched) would take (cached free blocks included)."""
        revived = sum(1 for b in matched if self.ref_counts[b] == 0)
        return seq.num_blocks_for(seq.num_tokens) - len(matched) + revived

    def can_allocate(self, seq: Sequence, matched: list[int]) -> bool:
        return self.num_blocks_to_allocate(seq, matched) <= self.num_free_blocks

    def allocate(self, seq: Sequence, matched: list[int]) -> None:
        """Give seq its blocks for all its current positions; the matched ones are computed."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already has blocks")
        if not self.can_allocate(seq, matched):
            raise RuntimeError(f"not enough free blocks for sequence {seq.seq_id}")
        for block_id in matched:
            if self.ref_counts[block_id] == 0:
                del self.cached_free_ids[block_id]
            self.ref_counts[block_id] += 1
            seq.block_table.append(block_id)
        for _ in range(seq.num_blocks_for(seq.num_tokens) - len(matched)):
            seq.block_table.append(self._take_free_block())
        seq.num_computed_tokens = len(matched) * self.block_size
        seq.num_hashed_blocks = len(matched)

    def can_append(self, seq: Sequence) -> bool:
        """True if seq's next position fits its blocks or one free block."""
        return self._num_missing_blocks(seq) <= self.num_free_blocks

    def can_append_all(self, seqs: list[Sequence]) -> bool:
        """True if the next position of every one of seqs fits its blocks or the free ones."""
        return sum(self._num_missing_blocks(seq) for seq in seqs) <= self.num_free_blocks

    def append_slots(self, seq: Sequence) -> None:
        """Grow seq's block table to cover all its positions."""
        for _ in range(self._num_missing_blocks(seq)):
            seq.block_table.append(self._take_free_block())

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; blocks nobody uses become free (keeping their hash)."""
        # Tail blocks first, so they are evicted before the prefix blocks that others may share.
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] < 0:
                raise RuntimeError(f"block {block_id} freed more often than allocated")
            if self.ref_counts[block_id] == 0:
                if self.hashes[block_id] is None:
                    self.empty_block_ids.append(block_id)
                else:
                    self.cached_free_ids[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_hashed_blocks = 0

    def hash_blocks(self, seq: Sequence) -> None:
        """Register seq's newly completed full blocks (all positions computed, their ids
        known on the host) in the cache."""
        num_full = seq.num_settled_tokens // self.block_size
        hashes = self.block_hashes(seq, num_full)
        for i in range(seq.num_hashed_blocks, num_full):
            block_id = seq.block_table[i]
            self.hashes[block_id], self.keys[block_id] = hashes[i], seq.block_key(i)
            self.hash_to_block_id[hashes[i]] = block_id  # the newest copy wins
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, num_full)

    def _num_missing_blocks(self, seq: Sequence) -> int:
        return max(0, seq.num_blocks_for(seq.num_tokens) - len(seq.block_table))

    def _take_free_block(self) -> int:
        if self.empty_block_ids:
            block_id = self.empty_block_ids.popleft()
        elif self.cached_free_ids:
            block_id, _ = self.cached_free_ids.popitem(last=False)  # evict least recently freed
        else:
            raise RuntimeError("KV block pool exhausted")
        old = self.hashes[block_id]
        if old is not None and self.hash_to_block_id.get(old) == block_id:
            del self.hash_to_block_id[old]
        self.hashes[block_id] = self.keys[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id
