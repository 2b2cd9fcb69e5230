"""The Triton kernel of launched_step.take_sampled: a launched step's rows take the ids the
previous step sampled, on the device, in one launch.

Its torch reference (launched_step.py) makes about thirty torch calls from Python a step
(indexing included). Each torch call may hand the interpreter's lock to the other threads and
wait to take it back, and while the
detokenizer's worker and the event loop run Python a decode step's host part waits at every
handover (an H200's slow steps at 32 sessions spent 60-80% of their time on the host); one
launch hands it over once. Imported only when the kernel is used (layers/triton_support.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # columns a program


# One compiled kernel serves every batch: no argument is specialized on its value (Triton
# would compile again for a width of 1, or one divisible by 16, in the middle of serving).
@triton.jit(do_not_specialize=["stride_ids_row", "stride_src_row", "previous_padded", "n"])
def _take_sampled_kernel(
    ids_ptr,
    sources_ptr,
    tokens_ptr,
    stride_ids_row,
    stride_ids_col,
    stride_src_row,
    stride_src_col,
    stride_tokens,
    previous_padded,
    n,
    BLOCK: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n
    text_from = tl.load(sources_ptr + cols * stride_src_col, mask=inside, other=-1)
    audio_from = tl.load(sources_ptr + stride_src_row + cols * stride_src_col, mask=inside, other=-1)
    takes_text = inside & (text_from >= 0)
    takes_audio = inside & (audio_from >= 0)
    # Tokens are float64 (text rows, then audio rows): whole numbers, exact as int64.
    text = tl.load(tokens_ptr + tl.maximum(text_from, 0) * stride_tokens, mask=takes_text, other=0.0).to(tl.int64)
    audio_row = previous_padded + tl.maximum(audio_from, 0)
    audio = tl.load(tokens_ptr + audio_row * stride_tokens, mask=takes_audio, other=0.0).to(tl.int64)
    # ids rows: audio id, text id, use_text (a sampled text id's own: not the blank 0).
    column = cols * stride_ids_col
    tl.store(ids_ptr + column, audio, mask=takes_audio)
    tl.store(ids_ptr + stride_ids_row + column, text, mask=takes_text)
    tl.store(ids_ptr + 2 * stride_ids_row + column, (text != 0).to(tl.int64), mask=takes_text)


def take_sampled_triton(ids: torch.Tensor, sources: torch.Tensor, samples: torch.Tensor) -> None:
    """As launched_step.take_sampled (ids [3, N] long written in place, sources [2, N] long,
    samples float64 [2, 2 * Bp]), on the current stream."""
    n = ids.shape[1]
    tokens = samples[0]
    _take_sampled_kernel[(triton.cdiv(n, BLOCK),)](
        ids,
        sources,
        tokens,
        ids.stride(0),
        ids.stride(1),
        sources.stride(0),
        sources.stride(1),
        tokens.stride(0),
        tokens.shape[0] // 2,
        n,
        BLOCK=BLOCK,
    )


def warm_up(device: torch.device) -> None:
    """Compile the kernel now (a no-op launch: no row takes an id), not in the first step
    that takes sampled ids."""
    ids = torch.zeros(3, 2, dtype=torch.long, device=device)
    sources = torch.full((2, 2), -1, dtype=torch.long, device=device)
    take_sampled_triton(ids, sources, torch.zeros(2, 2, dtype=torch.float64, device=device))
