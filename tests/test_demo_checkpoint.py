"""The demo checkpoint has exactly the golden (official) layout, is small and deterministic."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from kimiaudio.checkpoint.files import read_json
from kimiaudio.checkpoint.paths import DEMO_MARKER, find_checkpoint
from kimiaudio.errors import CheckpointError
from kimiaudio.models.kaiser_filter import kaiser_sinc_lowpass
from kimiaudio.random_weights.demo_checkpoint import ensure_demo_checkpoint, write_demo_checkpoint
from kimiaudio.text.special_tokens import SpecialTokens
from kimiaudio.text.tokenizer import KimiTokenizer

# The demo writer follows golden variant a's flags, layer counts and token numbering (its widths
# are its own), so its layout is compared with that variant alone: the other golden variants
# differ from it in exactly those, on purpose.
GOLDEN = Path(__file__).parent / "data" / "golden_a" / "checkpoint"
GOLDEN_ONLY = {"TINY_CHECKPOINT.json"}  # the golden generator's own note, not part of the layout


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_checkpoint(tmp_path_factory.mktemp("demo") / "ckpt")


@pytest.fixture(scope="module")
def twin() -> Path:
    """The golden checkpoint the demo mirrors."""
    if not GOLDEN.is_dir():
        pytest.skip(f"{GOLDEN} (the golden variant the demo checkpoint mirrors) is not here")
    return GOLDEN


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _tensor_names(path: Path) -> set[str]:
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            return set(f.keys())
    obj = torch.load(str(path), map_location="cpu", weights_only=True)
    (key,) = obj.keys()
    return {f"{key}/{name}" for name in obj[key]}


def _keys(path: Path) -> set[str]:
    data = yaml.safe_load(path.read_text()) if path.suffix == ".yaml" else json.loads(path.read_text())

    def walk(d, prefix=""):
        out = set()
        for k, v in d.items():
            out.add(prefix + k)
            if isinstance(v, dict) and k != "added_tokens_decoder":
                out |= walk(v, prefix + k + ".")
        return out

    return walk(data)


def test_same_files_as_golden(demo, twin):
    assert _files(demo) == (_files(twin) - GOLDEN_ONLY) | {DEMO_MARKER}


def test_same_config_keys_as_golden(demo, twin):
    for rel in sorted(_files(twin) - GOLDEN_ONLY):
        if rel.endswith((".json", ".yaml")):
            assert _keys(demo / rel) == _keys(twin / rel), rel


def test_same_tensor_names_as_golden(demo, twin):
    for rel in sorted(_files(twin)):
        if rel.endswith((".safetensors", ".pt")):
            assert _tensor_names(demo / rel) == _tensor_names(twin / rel), rel


def test_shapes_follow_configs(demo):
    config = read_json(demo / "config.json")
    h, vocab = config["hidden_size"], config["vocab_size"]
    with safe_open(str(demo / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [vocab, h]
        assert f.get_slice("model.vq_adaptor.layers.0.weight").get_shape() == [h, config["kimia_adaptor_input_dim"]]
    glm = read_json(demo / "glm-4-voice-tokenizer" / "config.json")
    with safe_open(str(demo / "glm-4-voice-tokenizer" / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("codebook.weight").get_shape() == [glm["quantize_vocab_size"], glm["d_model"]]
    assert vocab - config["kimia_token_offset"] == glm["quantize_vocab_size"]
    whisper = read_json(demo / "whisper-large-v3" / "config.json")
    assert config["kimia_adaptor_input_dim"] == 4 * whisper["d_model"]
    dit = yaml.safe_load((demo / "audio_detokenizer" / "config.yaml").read_text())["model"]["dit"]
    state = torch.load(str(demo / "audio_detokenizer" / "model.pt"), weights_only=True)["state_dict"]
    assert state["speech_model.semantic_token_embedding.weight"].shape == (
        dit["semantic_vocab_size"] + 1,
        dit["hidden_size"],
    )


def test_tokenizer_and_specials_load(demo, twin):
    paths = find_checkpoint(demo)
    assert paths.is_demo
    tok = KimiTokenizer.from_checkpoint(paths)
    specials = SpecialTokens.from_tokenizer(tok, read_json(paths.lm_config))
    golden_tok = KimiTokenizer.from_checkpoint(find_checkpoint(twin))
    for name in ("<|im_msg_end|>", "<|im_media_begin|>", "<|im_kimia_speech_ctd_id|>", "<|reserved_token_49|>"):
        assert tok.special_id(name) == golden_tok.special_id(name)
    assert specials.num_audio_codes == read_json(paths.glm_tokenizer / "config.json")["quantize_vocab_size"]


def test_antialias_filters_match_official_bigvgan(demo, twin):
    # The golden checkpoint's filters were computed by the official BigVGAN code.
    golden = torch.load(str(twin / "vocoder" / "model.pt"), weights_only=True)["generator"]
    ours = torch.load(str(demo / "vocoder" / "model.pt"), weights_only=True)["generator"]
    reference = golden["activation_post.upsample.filter"]
    torch.testing.assert_close(kaiser_sinc_lowpass(0.25, 0.3, 12), reference, atol=1e-7, rtol=0)
    for name, value in ours.items():
        if name.endswith("filter"):
            torch.testing.assert_close(value, reference, atol=1e-7, rtol=0)


def test_weight_norm_g_is_norm_of_v(demo):
    state = torch.load(str(demo / "vocoder" / "model.pt"), weights_only=True)["generator"]
    v, g = state["resblocks.0.convs1.0.weight_v"], state["resblocks.0.convs1.0.weight_g"]
    torch.testing.assert_close(g.flatten(), v.flatten(1).norm(dim=1))


def test_small(demo):
    assert sum((demo / rel).stat().st_size for rel in _files(demo)) < 30 * 2**20


def test_marker_says_random(demo):
    marker = read_json(demo / DEMO_MARKER)
    assert marker["random_weights"] is True and "Kimi-Audio-7B-Instruct" in marker["use_real_weights"]


def _hashes(root: Path) -> dict[str, str]:
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in _files(root)}


def test_deterministic(demo, tmp_path):
    again = write_demo_checkpoint(tmp_path / "again", seed=0)
    assert _hashes(again) == _hashes(demo)
    other = write_demo_checkpoint(tmp_path / "other", seed=1)
    assert _hashes(other)["model.safetensors"] != _hashes(demo)["model.safetensors"]


def test_ensure_writes_once_and_reuses(tmp_path, monkeypatch):
    first = ensure_demo_checkpoint(tmp_path)
    assert first == tmp_path / "demo-checkpoint" and find_checkpoint(first).is_demo
    stamp = (first / "config.json").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("rewrote a complete demo checkpoint")

    monkeypatch.setattr("kimiaudio.random_weights.demo_checkpoint._write_beside", fail)
    assert ensure_demo_checkpoint(tmp_path) == first
    assert (first / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["demo-checkpoint"]  # no temp dirs left


def test_a_write_that_fails_midway_leaves_nothing_that_looks_whole(tmp_path, monkeypatch):
    """A full disk (or an interrupt) after some parts: the directory asked for stays empty and
    no temporary directory is left beside it, so a later run writes it again."""

    def disk_full(out, seed):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("kimiaudio.random_weights.demo_checkpoint._write_detokenizer", disk_full)
    with pytest.raises(CheckpointError, match=f"{tmp_path}: the demo checkpoint cannot be written there .No space"):
        write_demo_checkpoint(tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not any((tmp_path / "out").iterdir())
    with pytest.raises(CheckpointError, match="No space"):
        ensure_demo_checkpoint(tmp_path / "data")
    assert not any((tmp_path / "data").iterdir())
    monkeypatch.undo()
    assert find_checkpoint(write_demo_checkpoint(tmp_path / "out")).is_demo


def test_serve_on_a_disk_too_full_for_the_demo_checkpoint_is_one_line(tmp_path):
    """Room for the database, not for the demo's weights (files up to 2 MiB, a full disk's
    failure): one line naming the data directory, nothing half-written left in it."""
    from helpers.cli import assert_one_line_error, kimiaudio
    from helpers.serve_process import free_port

    data = tmp_path / "data"
    result = kimiaudio("serve", "--data-dir", str(data), "--port", str(free_port()), files_up_to=2 * 2**20)
    assert_one_line_error(result, f"{data}: the demo checkpoint cannot be written there", "model.safetensors")
    assert "internal error" not in result.stderr
    assert sorted(p.name for p in data.iterdir()) == ["kimiaudio.db", "kimiaudio.db.owner"]


def test_ensure_refuses_incomplete_directory(tmp_path):
    (tmp_path / "demo-checkpoint").mkdir()
    (tmp_path / "demo-checkpoint" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="incomplete"):
        ensure_demo_checkpoint(tmp_path)


def test_loads_through_the_real_loaders(demo):
    from kimiaudio.audio.glm4_tokenizer import load_glm4_tokenizer
    from kimiaudio.audio.whisper_features import load_whisper_encoder
    from kimiaudio.config import DetokConfig
    from kimiaudio.detok.detokenizer import Detokenizer
    from kimiaudio.models.kimia_lm import load_lm

    paths = find_checkpoint(demo)
    config = json.loads((demo / "config.json").read_text())
    lm = load_lm(paths, "cpu", torch.float32)
    assert len(lm.model.layers) == config["num_hidden_layers"]
    assert len(lm.model.mimo_layers) == config["kimia_mimo_layers"]
    whisper = load_whisper_encoder(paths)
    assert whisper.encoder.layers and all(torch.isfinite(p).all() for p in whisper.encoder.parameters())
    glm4 = load_glm4_tokenizer(paths)
    detok = Detokenizer.load(paths, "cpu", torch.float32, DetokConfig())
    # The speech codes the tokenizer makes are the ones the detokenizer reads.
    assert detok.dit.cfg.semantic_vocab_size == glm4.model.config.quantize_vocab_size


def test_demo_replies_end_after_a_few_seconds(demo):
    # The tuned msg_end row: with the default sampling, speech replies stop on their own.
    from kimiaudio.engine.reference_loop import generate_reference
    from kimiaudio.engine.sampling_params import SamplingParams
    from kimiaudio.models.kimia_lm import load_lm
    from kimiaudio.text.prompt import Message, build_prompt

    paths = find_checkpoint(demo)
    tok = KimiTokenizer.from_checkpoint(paths)
    specials = SpecialTokens.from_tokenizer(tok, read_json(paths.lm_config))
    lm = load_lm(paths, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(5)
    steps = []
    for seed in range(6):
        n = 20 + 10 * seed
        codes = torch.randint(0, specials.num_audio_codes, (n,), generator=gen).tolist()
        features = torch.randn(n, lm.config.kimia_adaptor_input_dim, generator=gen)
        prompt = build_prompt([Message("user", "audio", audio_tokens=codes, features=features)], "both", tok, specials)
        params = SamplingParams(seed=seed, max_new_tokens=300)  # default sampling: audio T 0.8, top-k 10
        result = generate_reference(
            lm,
            prompt.audio_ids,
            prompt.text_ids,
            prompt.continuous_mask,
            prompt.features,
            params,
            "both",
            specials,
            record_steps=True,
        )
        assert result.finish_reason != "length"
        steps.append(len(result.steps))
    steps.sort()
    assert 15 <= steps[len(steps) // 2] <= 100, steps


def test_ensure_rewrites_a_demo_checkpoint_from_an_older_writer(tmp_path):
    import json

    from kimiaudio.checkpoint.paths import DEMO_MARKER
    from kimiaudio.random_weights.demo_checkpoint import GENERATOR_VERSION, ensure_demo_checkpoint

    root = ensure_demo_checkpoint(tmp_path)
    marker = root / DEMO_MARKER
    old = json.loads(marker.read_text())
    marker.write_text(json.dumps({**old, "generator_version": GENERATOR_VERSION - 1}))
    (root / "stale-file").write_text("from the old writer")
    again = ensure_demo_checkpoint(tmp_path)
    assert again == root and not (root / "stale-file").exists()
    assert json.loads(marker.read_text())["generator_version"] == GENERATOR_VERSION


def test_serve_says_it_creates_the_demo_checkpoint_only_when_it_does(tmp_path):
    import json

    from kimiaudio.config import load_config
    from kimiaudio.server.serve import loading_message

    config = load_config(None, {"storage": {"data_dir": str(tmp_path)}})
    demo = tmp_path / "demo-checkpoint"
    first = loading_message(config)
    assert first.startswith(f"Creating the demo checkpoint in {demo}") and "noise" in first
    root = ensure_demo_checkpoint(tmp_path)
    again = loading_message(config)
    assert again.startswith(f"Loading the demo checkpoint in {demo}") and "noise" in again
    marker = root / DEMO_MARKER  # an older writer's checkpoint is rewritten: created again
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "generator_version": -1}))
    assert loading_message(config).startswith("Creating the demo checkpoint")
    real = load_config(None, {"model": {"path": str(tmp_path / "real")}, "storage": {"data_dir": str(tmp_path)}})
    message = loading_message(real)
    assert str(tmp_path / "real") in message and "demo" not in message


def test_in_memory_parts_equal_the_files_loaded(demo):
    # One generator: the benches' in-memory parts of the demo shape are the demo's files, loaded.
    from kimiaudio.audio.glm4_tokenizer import Glm4SpeechTokenizer
    from kimiaudio.audio.whisper_features import WhisperFeatureEncoder
    from kimiaudio.models.bigvgan import load_vocoder
    from kimiaudio.models.dit import load_dit
    from kimiaudio.models.kimia_lm import load_lm
    from kimiaudio.random_weights.modules import RandomParts
    from kimiaudio.random_weights.shapes import DEMO

    paths = find_checkpoint(demo)
    parts = RandomParts(DEMO, "cpu", torch.float32, seed=0)
    pairs = {
        "lm": (parts.lm(), load_lm(paths, "cpu", torch.float32)),
        "whisper": (parts.whisper().encoder, WhisperFeatureEncoder.load(paths).encoder),
        "glm": (parts.glm4().model, Glm4SpeechTokenizer.load(paths).model),
        "dit": (parts.dit(), load_dit(paths.detokenizer, "cpu", torch.float32)),
        "vocoder": (parts.vocoder(), load_vocoder(paths.vocoder, "cpu", torch.float32)),
    }
    for part, (built, loaded) in pairs.items():
        ours, theirs = built.state_dict(), loaded.state_dict()
        assert ours.keys() == theirs.keys(), part
        for name in ours:
            assert torch.equal(ours[name], theirs[name]), (part, name)


def test_full_shape_fits_the_modules_on_meta():
    # The real sizes through the same generators and modules, on the meta device: nothing allocated.
    from kimiaudio.random_weights.modules import RandomParts
    from kimiaudio.random_weights.shapes import FULL

    parts = RandomParts(FULL, "meta", torch.bfloat16)
    lm = parts.lm()
    assert lm.config.vocab_size == 168448 and lm.config.hidden_size == 3584 and lm.config.num_kv_layers == 34
    assert lm.config.kimia_adaptor_input_dim == 4 * parts.whisper_config["d_model"] == 5120
    whisper = parts.whisper().encoder
    glm = parts.glm4().model
    assert len(whisper.layers) == 32 and len(glm.layers) == FULL.glm.quantize_position
    assert glm.codebook.weight.shape == (16384, 1280) and glm.codebook.weight.dtype == torch.float32
    dit, vocoder = parts.dit(), parts.vocoder()
    assert dit.cfg.semantic_vocab_size == 16384 and vocoder.cfg.hop_size == 480
    for module in (lm, whisper, glm, dit, vocoder):
        assert all(t.is_meta for t in module.parameters())


def test_unknown_shape_is_a_clear_error():
    from kimiaudio.errors import KimiAudioError
    from kimiaudio.random_weights.shapes import shape_named

    with pytest.raises(KimiAudioError, match="'huge': expected one of demo, full, tiny"):
        shape_named("huge")
