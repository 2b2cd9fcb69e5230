"""DiT, Euler schedule and BigVGAN against the official goldens (tests/data/golden_*)."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from kimiaudio.config import DetokConfig
from kimiaudio.config.chunk_schedule import ChunkSchedule
from kimiaudio.detok.buckets import Buckets, BucketShape
from kimiaudio.detok.dit_batch import DiTBatch, StaticArena
from kimiaudio.detok.flow_matching import REFRESH_T, ChunkJob, FlowMatcher, euler_schedule, timestep_ids
from kimiaudio.detok.vocoder_batch import VocoderBatcher
from kimiaudio.errors import CheckpointError
from kimiaudio.models.bigvgan import load_vocoder
from kimiaudio.models.dit import DiTConfig, load_dit

from helpers.detok_reference import vocoder_samples

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def dit(golden_checkpoint):
    return load_dit(golden_checkpoint / "audio_detokenizer", torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def vocoder(golden_checkpoint):
    return load_vocoder(golden_checkpoint / "vocoder", torch.device("cpu"), torch.float32)


@torch.inference_mode()
@pytest.mark.parametrize("padded", [False, True])
def test_dit_step_velocity(golden, dit, padded):
    """One DiT call on static batch buffers (exactly the chunk, or a padded bucket) = official."""
    ids, pos, x = golden["detok.dit_step.cond"], golden["detok.dit_step.position_ids"], golden["detok.dit_step.x"]
    n = ids.shape[1]
    shape = BucketShape(3, n + 13, 32) if padded else BucketShape(1, n, 0)
    batch = DiTBatch(dit, shape, StaticArena(torch.device("cpu")))
    batch.load([ChunkJob(ids[0], x[0], int(pos[0, 0]), None, 0, False)])
    batch.t.fill_(int(timestep_ids(golden["detok.dit_step.t"])))
    v = dit(batch.x, batch.t, batch.ctx)
    torch.testing.assert_close(v[:1, :n], golden["detok.dit_step.velocity"], **TOL)


def test_euler_schedule_matches_torchdyn_t(golden, golden_meta):
    detok = golden_meta["sections"]["detok"]
    t, dt = euler_schedule(detok["ode_steps"])
    # Per chunk: the Euler t values, then the refresh call after a chunk that is not final.
    final_column = detok["detok.s37"]["chunk_info_columns"].index("is_final")
    expected = []
    for is_final in golden["detok.s37.chunk_info"][:, final_column].tolist():
        expected += t.tolist() + ([] if is_final else [torch.tensor(REFRESH_T).item()])
    assert golden["detok.s37.ode_t"].tolist() == expected
    # The DiT receives int64 (t * 1000).long() (golden README).
    assert torch.equal(timestep_ids(t), (t * 1000).long()) and timestep_ids(torch.tensor([REFRESH_T])).item() == 999
    assert torch.allclose(t + dt, torch.cat([t[1:], torch.ones(1)]))


def test_infer_chunk_mel(golden, golden_meta, dit):
    info = golden_meta["sections"]["detok"]["infer_chunk"]
    flow = FlowMatcher(dit, _buckets(exact=True))
    look_ahead = info["look_ahead_tokens"] * golden_meta["sections"]["detok"]["upsample_factor"]
    job = ChunkJob(
        golden["detok.infer_chunk.semantic_tokens"],
        golden["detok.infer_chunk.noise"],
        info["start_position_id"],
        None,
        look_ahead,
        False,
        info["ode_steps"],
    )
    (out,) = flow.infer_chunks([job])
    torch.testing.assert_close(out.mel, golden["detok.infer_chunk.mel"], **TOL)
    assert out.kv is None


def _buckets(exact: bool, max_batch: int = 4) -> Buckets:
    schedule = ChunkSchedule.from_config(
        DetokConfig(chunk_tokens=6, look_ahead_tokens=3, max_chunk_tokens=9, max_kv_cache_frames=40), 4096
    )
    return Buckets.for_schedule(schedule, max_batch, exact=exact)


@pytest.mark.parametrize("bucketed", [False, True])
def test_infer_chunk_batched_equals_alone(dit, bucketed):
    """Different lengths, positions, prefixes and step counts in padded batches (and split
    beyond the largest batch) give each job what it gets alone, unpadded."""
    g = torch.Generator().manual_seed(0)
    heads, hd = dit.kv_shape
    codebook, mel_bins = dit.cfg.semantic_vocab_size, dit.cfg.input_size
    jobs = [
        ChunkJob(
            torch.randint(0, codebook, (n,), generator=g),
            torch.randn(n, mel_bins, generator=g),
            start,
            None if p == 0 else torch.randn(dit.cfg.depth, 2, heads, p, hd, generator=g),
            la,
            keep,
            steps,
        )
        for n, start, p, la, keep, steps in [
            (40, 0, 0, 8, True, 5),
            (24, 100, 30, 0, True, 5),
            (33, 7, 12, 0, False, 5),
            (20, 3, 9, 4, True, 3),
            (36, 50, 40, 12, True, 5),
            (8, 9, 0, 4, True, 5),
            (0, 4, 20, 0, False, 5),
        ]
    ]
    batched = FlowMatcher(dit, _buckets(exact=not bucketed, max_batch=4))
    assert batched.buckets.frame_sizes == (32, 48) and batched.buckets.prefix_sizes == (0, 48)
    alone = FlowMatcher(dit, _buckets(exact=True, max_batch=1))
    together = batched.infer_chunks(jobs)
    for job, out in zip(jobs, together):
        (single,) = alone.infer_chunks([job])
        kept = job.token_ids.numel() - job.look_ahead
        assert out.mel.shape == (kept, mel_bins)
        torch.testing.assert_close(out.mel, single.mel, **TOL)
        if job.keep_kv and kept:
            torch.testing.assert_close(out.kv, single.kv, **TOL)
            assert out.kv.shape == (dit.cfg.depth, 2, heads, kept, hd)
        else:
            assert out.kv is None and single.kv is None


@torch.inference_mode()
def test_vocoder_wav(golden, vocoder):
    wav = vocoder(golden["detok.vocoder.mel"].T[None])
    torch.testing.assert_close(wav[0], golden["detok.vocoder.wav"], **TOL)


@torch.inference_mode()
def test_folded_weight_norm_equals_per_call(golden, golden_checkpoint, vocoder):
    unfolded = load_vocoder(golden_checkpoint / "vocoder", torch.device("cpu"), torch.float32, fold=False)
    assert not any(name.endswith("weight_g") for name, _ in vocoder.named_parameters())
    mel = golden["detok.vocoder.mel"].T[None]
    assert torch.equal(vocoder(mel), unfolded(mel))


@torch.inference_mode()
def test_vocoder_batcher_pads_rows_only(golden, golden_checkpoint, vocoder):
    """Equal lengths share a forward (rows padded to a bucket); other lengths run apart."""
    mel = golden["detok.vocoder.mel"]  # [T, mel bins]
    bins = mel.shape[1]
    mels = [mel, mel[:20] * 0.5, mel.flip(0) - 1.0, mel[:20] + 0.25, mel[:0], mel[:7]]
    calls = []
    batcher = VocoderBatcher(vocoder, (1, 2, 4), padded=True)
    hook = vocoder.register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    wavs = batcher.vocode(mels)
    hook.remove()
    assert sorted(calls) == sorted([(2, bins, mel.shape[0]), (2, bins, 20), (1, bins, 7)])
    samples = vocoder_samples(golden_checkpoint)  # from the checkpoint's vocoder/config.json
    for m, wav in zip(mels, wavs):
        alone = vocoder(m.T[None])[0, 0] if m.shape[0] else torch.zeros(0)
        torch.testing.assert_close(wav, alone, **TOL)
        assert wav.numel() == samples(m.shape[0])
    three = VocoderBatcher(vocoder, (1, 2, 4), padded=True).vocode([mel[:9], mel[:9] * 0.9, mel[:9] * 0.8])
    assert [w.numel() for w in three] == [samples(9)] * 3


@torch.inference_mode()
def test_vocoder_batch_equals_alone(golden, vocoder):
    mel = golden["detok.vocoder.mel"].T[None]
    batch = torch.cat([mel, mel.flip(-1) * 0.5 - 2.0])
    out = vocoder(batch)
    torch.testing.assert_close(out[1:], vocoder(batch[1:]), **TOL)
    torch.testing.assert_close(out[0, 0], golden["detok.vocoder.wav"][0], **TOL)


def _copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_speech_model_key(golden_checkpoint, tmp_path):
    d = _copy_dir(golden_checkpoint / "audio_detokenizer", tmp_path / "audio_detokenizer")
    last = DiTConfig.from_yaml(d / "config.yaml").depth - 1
    state = torch.load(d / "model.pt", weights_only=True)
    del state["state_dict"][f"speech_model.blocks.{last}.attn.qkv.weight"]
    torch.save(state, d / "model.pt")
    with pytest.raises(CheckpointError, match=rf"model\.pt.*blocks\.{last}\.attn\.qkv\.weight"):
        load_dit(d, torch.device("cpu"), torch.float32)


def _edit_yaml(path: Path, edit) -> None:
    """Rewrite config.yaml with `edit` applied to its `model.dit` mapping."""
    raw = yaml.safe_load(path.read_text())
    edit(raw["model"]["dit"])
    path.write_text(yaml.safe_dump(raw))


@pytest.mark.parametrize(
    "key,bad",
    [("ffn_type", "conv1d_conv1d"), ("position_embedding_type", "alibi"), ("hidden_size", None), ("depth", "two")],
)
def test_bad_config_yaml(golden_checkpoint, tmp_path, key, bad):
    """bad None: the key is missing."""
    d = _copy_dir(golden_checkpoint / "audio_detokenizer", tmp_path / "audio_detokenizer")
    _edit_yaml(d / "config.yaml", lambda dit: dit.pop(key) if bad is None else dit.update({key: bad}))
    with pytest.raises(CheckpointError, match=rf"config\.yaml.*{key}"):
        load_dit(d, torch.device("cpu"), torch.float32)


def test_vocoder_errors(golden_checkpoint, tmp_path):
    d = _copy_dir(golden_checkpoint / "vocoder", tmp_path / "vocoder")
    state = torch.load(d / "model.pt", weights_only=True)
    name = next(k for k in state["generator"] if k.endswith("upsample.filter"))
    del state["generator"][name]
    torch.save(state, d / "model.pt")
    with pytest.raises(CheckpointError, match=rf"model\.pt.*{re.escape(name)}"):
        load_vocoder(d, torch.device("cpu"), torch.float32)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "resblock": "3"}))
    with pytest.raises(CheckpointError, match=r"config\.json.*resblock"):
        load_vocoder(d, torch.device("cpu"), torch.float32)


def _dit_variant(checkpoint: Path, tmp_path, kind, extra):
    """The golden DiT with another position embedding: `extra` replaces its position tensors."""
    d = _copy_dir(checkpoint / "audio_detokenizer", tmp_path / kind)
    _edit_yaml(d / "config.yaml", lambda dit: dit.update(position_embedding_type=kind))
    state = torch.load(d / "model.pt", weights_only=True)
    state["state_dict"] = {k: v for k, v in state["state_dict"].items() if ".position_embedding." not in k}
    state["state_dict"].update(extra)
    torch.save(state, d / "model.pt")
    return load_dit(d, torch.device("cpu"), torch.float32)


def test_sincos_positions_are_chunk_relative(golden_checkpoint, tmp_path):
    """fairseq make_positions(padding_idx=0): ids s..s+n-1 -> rows 1..n (s>0); id 0 -> zero row."""
    dit = _dit_variant(
        golden_checkpoint, tmp_path, "sincos", {"speech_model.position_embedding._float_tensor": torch.zeros(1)}
    )
    half = dit.cfg.hidden_size // 2
    freqs = torch.exp(torch.arange(half) * -(torch.log(torch.tensor(10000.0)) / (half - 1)))

    def row(p):
        return torch.zeros(dit.cfg.hidden_size) if p == 0 else torch.cat([torch.sin(p * freqs), torch.cos(p * freqs)])

    later = dit._position_embedding(torch.arange(7, 47)[None])[0]
    torch.testing.assert_close(later, torch.stack([row(p) for p in range(1, 41)]), atol=1e-5, rtol=1e-5)
    first = dit._position_embedding(torch.arange(0, 40)[None])[0]
    torch.testing.assert_close(first, torch.stack([row(p) for p in range(0, 40)]), atol=1e-5, rtol=1e-5)


def test_learnable_positions_index_the_table(golden_checkpoint, tmp_path):
    cfg = DiTConfig.from_yaml(golden_checkpoint / "audio_detokenizer" / "config.yaml")
    table = torch.randn(cfg.max_seq_len + 1, cfg.hidden_size)  # official nn.Embedding(max_seq_len + 1, hidden)
    dit = _dit_variant(golden_checkpoint, tmp_path, "learnable", {"speech_model.position_embedding.weight": table})
    pos = torch.arange(7, 47)[None]
    torch.testing.assert_close(dit._position_embedding(pos), table[pos])
    with pytest.raises(CheckpointError, match="position_embedding.weight"):
        _dit_variant(golden_checkpoint, tmp_path / "b", "learnable", {})
