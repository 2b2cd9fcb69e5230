"""The launched step's id-taking kernel (engine/triton_take_sampled.py) against its torch
reference (launched_step.take_sampled): the same ids written, and nothing else.

Compiled on a GPU; in Triton's interpreter on CPU tensors without one.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kimiaudio.engine.launched_step import take_sampled  # noqa: E402
from kimiaudio.engine.triton_take_sampled import take_sampled_triton  # noqa: E402
from kimiaudio.layers import triton_support  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
NUM_FIELDS = 8  # as a decode batch's buffer: ids in rows 0-2, the sources in rows 6-7


def case(columns: int, previous_padded: int, seed: int):
    """A fields buffer whose rows 0-2 are ids and 6-7 sources (as decode_batch.py lays them
    out), and a previous step's samples: tokens (text rows, then audio rows), log-probabilities."""
    gen = torch.Generator().manual_seed(seed)
    fields = torch.randint(0, 50, (NUM_FIELDS, columns), generator=gen)
    fields[6:8] = torch.randint(-1, previous_padded, (2, columns), generator=gen)
    tokens = torch.randint(0, 3, (2 * previous_padded,), generator=gen).double()  # blank text ids too
    samples = torch.stack([tokens, torch.randn(2 * previous_padded, generator=gen, dtype=torch.float64)])
    return fields, samples


@pytest.mark.parametrize(("columns", "previous_padded"), [(1, 1), (3, 4), (17, 16), (64, 64), (1100, 1024)])
def test_kernel_writes_what_the_torch_reference_writes(monkeypatch, columns, previous_padded):
    fields, samples = case(columns, previous_padded, seed=columns)
    expected = fields.clone()
    monkeypatch.setattr(triton_support, "kernel_mode", lambda: "torch")
    take_sampled(expected[0:3], expected[6:8], samples)
    got = fields.clone().to(DEVICE)
    take_sampled_triton(got[0:3], got[6:8], samples.to(DEVICE))
    assert torch.equal(got.cpu(), expected)
    assert not torch.equal(expected, fields)  # some row took a sampled id


def test_rows_without_a_source_keep_their_ids():
    fields, samples = case(9, 8, seed=3)
    fields[6:8] = -1
    got = fields.clone().to(DEVICE)
    take_sampled_triton(got[0:3], got[6:8], samples.to(DEVICE))
    assert torch.equal(got.cpu(), fields)
