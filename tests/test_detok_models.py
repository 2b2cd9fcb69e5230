"""DiT, Euler schedule and BigVGAN against the official goldens (tests/data/golden_a)."""

import shutil
from pathlib import Path

import pytest
import torch

from kimiaudio.config import DetokConfig
from kimiaudio.detok.buckets import BucketShape, Buckets
from kimiaudio.detok.dit_batch import DiTBatch, StaticArena
from kimiaudio.detok.flow_matching import REFRESH_T, ChunkJob, FlowMatcher, euler_schedule, timestep_ids
from kimiaudio.detok.settings import ChunkSchedule
from kimiaudio.detok.vocoder_batch import VocoderBatcher
from kimiaudio.errors import CheckpointError
from kimiaudio.models.bigvgan import load_vocoder
from kimiaudio.models.dit import load_dit

GOLDEN = Path(__file__).parent / "data" / "golden_a"
CKPT = GOLDEN / "checkpoint"
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def dit():
    return load_dit(CKPT / "audio_detokenizer", torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def vocoder():
    return load_vocoder(CKPT / "vocoder", torch.device("cpu"), torch.float32)


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


def test_euler_schedule_matches_torchdyn_t(golden):
    t, dt = euler_schedule(30)
    ode_t = golden["detok.s37.ode_t"]  # chunk 0: 29 Euler t, then the 0.999 refresh; chunk 1 (final): 29
    assert torch.equal(t, ode_t[:29]) and torch.equal(t, ode_t[30:])
    assert ode_t[29].item() == torch.tensor(REFRESH_T).item()
    assert timestep_ids(t).tolist()[:4] == [0, 34, 68, 103] and timestep_ids(torch.tensor([REFRESH_T])).item() == 999
    assert torch.allclose(t + dt, torch.cat([t[1:], torch.ones(1)]))


def test_infer_chunk_mel(golden, dit):
    flow = FlowMatcher(dit, _buckets(exact=True))
    job = ChunkJob(golden["detok.infer_chunk.semantic_tokens"], golden["detok.infer_chunk.noise"], 0, None, 0, False, 30)
    (out,) = flow.infer_chunks([job])
    torch.testing.assert_close(out.mel, golden["detok.infer_chunk.mel"], **TOL)
    assert out.kv is None


def _buckets(exact: bool, max_batch: int = 4) -> Buckets:
    schedule = ChunkSchedule.from_config(DetokConfig(chunk_tokens=6, look_ahead_tokens=3, max_chunk_tokens=9,
                                                     max_kv_cache_frames=40), 4096)
    return Buckets.for_schedule(schedule, max_batch, exact=exact)


@pytest.mark.parametrize("bucketed", [False, True])
def test_infer_chunk_batched_equals_alone(dit, bucketed):
    """Different lengths, positions, prefixes and step counts in padded batches (and split
    beyond the largest batch) give each job what it gets alone, unpadded."""
    g = torch.Generator().manual_seed(0)
    heads, hd = dit.kv_shape
    jobs = [
        ChunkJob(torch.randint(0, 64, (n,), generator=g), torch.randn(n, 80, generator=g), start,
                 None if p == 0 else torch.randn(dit.cfg.depth, 2, heads, p, hd, generator=g), la, keep, steps)
        for n, start, p, la, keep, steps in [
            (40, 0, 0, 8, True, 5), (24, 100, 30, 0, True, 5), (33, 7, 12, 0, False, 5), (20, 3, 9, 4, True, 3),
            (36, 50, 40, 12, True, 5), (8, 9, 0, 4, True, 5), (0, 4, 20, 0, False, 5)]
    ]
    batched = FlowMatcher(dit, _buckets(exact=not bucketed, max_batch=4))
    assert batched.buckets.frame_sizes == (32, 48) and batched.buckets.prefix_sizes == (0, 48)
    alone = FlowMatcher(dit, _buckets(exact=True, max_batch=1))
    together = batched.infer_chunks(jobs)
    for job, out in zip(jobs, together):
        (single,) = alone.infer_chunks([job])
        kept = job.token_ids.numel() - job.look_ahead
        assert out.mel.shape == (kept, 80)
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
def test_folded_weight_norm_equals_per_call(golden, vocoder):
    unfolded = load_vocoder(CKPT / "vocoder", torch.device("cpu"), torch.float32, fold=False)
    assert not any(name.endswith("weight_g") for name, _ in vocoder.named_parameters())
    mel = golden["detok.vocoder.mel"].T[None]
    assert torch.equal(vocoder(mel), unfolded(mel))


@torch.inference_mode()
def test_vocoder_batcher_pads_rows_only(golden, vocoder):
    """Equal lengths share a forward (rows padded to a bucket); other lengths run apart."""
    mel = golden["detok.vocoder.mel"]  # [T, 80]
    mels = [mel, mel[:20] * 0.5, mel.flip(0) - 1.0, mel[:20] + 0.25, mel[:0], mel[:7]]
    calls = []
    batcher = VocoderBatcher(vocoder, (1, 2, 4), padded=True)
    hook = vocoder.register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    wavs = batcher.vocode(mels)
    hook.remove()
    assert sorted(calls) == sorted([(2, 80, mel.shape[0]), (2, 80, 20), (1, 80, 7)])
    for m, wav in zip(mels, wavs):
        alone = vocoder(m.T[None])[0, 0] if m.shape[0] else torch.zeros(0)
        torch.testing.assert_close(wav, alone, **TOL)
    three = VocoderBatcher(vocoder, (1, 2, 4), padded=True).vocode([mel[:9], mel[:9] * 0.9, mel[:9] * 0.8])
    assert [w.numel() for w in three] == [9 * 480] * 3


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


def test_missing_speech_model_key(tmp_path):
    d = _copy_dir(CKPT / "audio_detokenizer", tmp_path / "audio_detokenizer")
    state = torch.load(d / "model.pt", weights_only=True)
    del state["state_dict"]["speech_model.blocks.1.attn.qkv.weight"]
    torch.save(state, d / "model.pt")
    with pytest.raises(CheckpointError, match=r"model\.pt.*blocks\.1\.attn\.qkv\.weight"):
        load_dit(d, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize(
    "old,new",
    [("ffn_type: vanilla_mlp", "ffn_type: conv1d_conv1d"), ("position_embedding_type: skip", "position_embedding_type: alibi"),
     ("    hidden_size: 64\n", ""), ("depth: 2", "depth: two")],
)
def test_bad_config_yaml(tmp_path, old, new):
    d = _copy_dir(CKPT / "audio_detokenizer", tmp_path / "audio_detokenizer")
    text = (d / "config.yaml").read_text()
    assert old in text
    (d / "config.yaml").write_text(text.replace(old, new))
    with pytest.raises(CheckpointError, match=r"config\.yaml"):
        load_dit(d, torch.device("cpu"), torch.float32)


def test_vocoder_errors(tmp_path):
    d = _copy_dir(CKPT / "vocoder", tmp_path / "vocoder")
    state = torch.load(d / "model.pt", weights_only=True)
    del state["generator"]["resblocks.0.activations.3.upsample.filter"]
    torch.save(state, d / "model.pt")
    with pytest.raises(CheckpointError, match=r"model\.pt.*upsample\.filter"):
        load_vocoder(d, torch.device("cpu"), torch.float32)
    (d / "config.json").write_text((d / "config.json").read_text().replace('"resblock": "1"', '"resblock": "3"'))
    with pytest.raises(CheckpointError, match=r"config\.json.*resblock"):
        load_vocoder(d, torch.device("cpu"), torch.float32)


def _dit_variant(tmp_path, kind, extra):
    d = _copy_dir(CKPT / "audio_detokenizer", tmp_path / kind)
    (d / "config.yaml").write_text((d / "config.yaml").read_text().replace("position_embedding_type: skip", f"position_embedding_type: {kind}"))
    state = torch.load(d / "model.pt", weights_only=True)
    state["state_dict"].update(extra)
    torch.save(state, d / "model.pt")
    return load_dit(d, torch.device("cpu"), torch.float32)


def test_sincos_positions_are_chunk_relative(tmp_path):
    """fairseq make_positions(padding_idx=0): ids s..s+n-1 -> rows 1..n (s>0); id 0 -> zero row."""
    dit = _dit_variant(tmp_path, "sincos", {"speech_model.position_embedding._float_tensor": torch.zeros(1)})
    half = 32
    freqs = torch.exp(torch.arange(half) * -(torch.log(torch.tensor(10000.0)) / (half - 1)))

    def row(p):
        return torch.zeros(64) if p == 0 else torch.cat([torch.sin(p * freqs), torch.cos(p * freqs)])

    later = dit._position_embedding(torch.arange(7, 47)[None])[0]
    torch.testing.assert_close(later, torch.stack([row(p) for p in range(1, 41)]), atol=1e-5, rtol=1e-5)
    first = dit._position_embedding(torch.arange(0, 40)[None])[0]
    torch.testing.assert_close(first, torch.stack([row(p) for p in range(0, 40)]), atol=1e-5, rtol=1e-5)


def test_learnable_positions_index_the_table(tmp_path):
    table = torch.randn(4097, 64)
    dit = _dit_variant(tmp_path, "learnable", {"speech_model.position_embedding.weight": table})
    pos = torch.arange(7, 47)[None]
    torch.testing.assert_close(dit._position_embedding(pos), table[pos])
    with pytest.raises(CheckpointError, match="position_embedding.weight"):
        _dit_variant(tmp_path / "b", "learnable", {})
