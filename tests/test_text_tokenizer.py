"""Tokenizer and special tokens against the golden checkpoint's tokenizer files."""

import base64
import json
import shutil
from pathlib import Path

import pytest

from kimiaudio.checkpoint.files import read_json
from kimiaudio.checkpoint.paths import CheckpointPaths
from kimiaudio.errors import CheckpointError
from kimiaudio.text.special_tokens import SpecialTokens, official_special_names
from kimiaudio.text.tokenizer import KimiTokenizer


@pytest.fixture(scope="module")
def paths(golden_paths):
    return golden_paths


@pytest.fixture(scope="module")
def tok(paths):
    return KimiTokenizer.from_checkpoint(paths)


def _copy_tokenizer_files(paths: CheckpointPaths, tmp_path: Path) -> CheckpointPaths:
    for name in ("tiktoken.model", "tokenizer_config.json", "config.json"):
        shutil.copy(paths.root / name, tmp_path / name)
    return CheckpointPaths(root=tmp_path, glm_tokenizer=tmp_path / "glm-4-voice-tokenizer")


def test_special_ids_follow_tokenizer_config(tok, paths, golden_meta):
    decoder = read_json(paths.tokenizer_config)["added_tokens_decoder"]
    for key, entry in decoder.items():
        assert tok.special_id(entry["content"]) == int(key)
    specials = SpecialTokens.from_tokenizer(tok, read_json(paths.lm_config))
    expected = golden_meta["special_tokens"]
    assert specials.msg_end == expected["msg_end"]
    assert specials.media_begin == expected["media_begin"]
    assert specials.media_end == expected["media_end"]
    assert specials.text_blank == expected["kimia_text_blank"]
    assert specials.text_eos == expected["kimia_text_eos"]
    assert specials.user_msg_start == expected["kimia_user_msg_start"]
    assert specials.assistant_msg_start == expected["kimia_assistant_msg_start"]
    assert specials.speech_ct == expected["kimia_speech_ct_id"]
    assert specials.speech_ctd == expected["kimia_speech_ctd_id"]
    assert specials.token_offset == golden_meta["kimia_token_offset"]
    assert tok.vocab_size == golden_meta["kimia_token_offset"]


def test_golden_special_order_is_the_official_one(tok, paths):
    # A tiny golden tokenizer numbers its specials in the official order after its ranks.
    count = len(read_json(paths.tokenizer_config)["added_tokens_decoder"])
    for i, name in enumerate(official_special_names(count)):
        assert tok.special_id(name) == tok.num_base_tokens + i


def test_official_count_matches_real_offset():
    assert 151643 + len(official_special_names()) == 152064


def test_encode_matches_golden_prompt_text(tok, golden):
    text_stream = golden["lm.text.input.text_input_ids"][0].tolist()
    # [blank] + instruction tokens + blanks; decode drops the blanks
    instruction = tok.decode(text_stream)
    ids = tok.encode(instruction)
    assert instruction and text_stream[1 : 1 + len(ids)] == ids


@pytest.mark.parametrize("text", ["Hello, world! It's 2025.", "请转写这段话。", "mixed 中文 and English\n\ttabs  "])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_special_text_is_plain_text(tok):
    ids = tok.encode("<|im_msg_end|>")
    assert tok.special_id("<|im_msg_end|>") not in ids
    assert tok.decode(ids) == "<|im_msg_end|>"


def test_decode_drops_special_and_audio_ids(tok):
    blank = tok.special_id("<|im_kimia_text_blank|>")
    eos = tok.special_id("<|im_kimia_text_eos|>")
    ids = [blank] + tok.encode("hi") + [eos, tok.vocab_size + 5, blank]
    assert tok.decode(ids) == "hi"


def test_missing_special_names_the_file(tok):
    with pytest.raises(CheckpointError, match="tokenizer_config.json.*<\\|nope\\|>"):
        tok.special_id("<|nope|>")


def test_malformed_tiktoken_names_file_and_line(paths, tmp_path):
    paths = _copy_tokenizer_files(paths, tmp_path)
    lines = paths.tiktoken_model.read_text().splitlines()
    lines[4] = "not-base64!! 4"
    paths.tiktoken_model.write_text("\n".join(lines) + "\n")
    with pytest.raises(CheckpointError, match=r"tiktoken.model: line 5"):
        KimiTokenizer.from_checkpoint(paths)


def test_a_tiktoken_model_without_every_single_byte_is_refused(paths, tmp_path):
    """(tiktoken panics, a BaseException, when it meets a byte it has no token for.)"""
    paths = _copy_tokenizer_files(paths, tmp_path)
    lines = paths.tiktoken_model.read_text().splitlines()
    paths.tiktoken_model.write_text("\n".join(lines[:50]) + "\n")
    with pytest.raises(CheckpointError, match=r"tiktoken.model: 206 of the 256 single-byte tokens are missing"):
        KimiTokenizer.from_checkpoint(paths)


def test_special_id_inside_ranks_is_refused(paths, tmp_path):
    paths = _copy_tokenizer_files(paths, tmp_path)
    config = json.loads(paths.tokenizer_config.read_text())
    config["added_tokens_decoder"]["12"] = {"content": "<|bad|>"}
    paths.tokenizer_config.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="tokenizer_config.json.*'12'"):
        KimiTokenizer.from_checkpoint(paths)


def test_without_added_tokens_decoder_uses_official_numbering(paths, tmp_path):
    paths = _copy_tokenizer_files(paths, tmp_path)
    config = json.loads(paths.tokenizer_config.read_text())
    del config["added_tokens_decoder"]
    paths.tokenizer_config.write_text(json.dumps(config))
    tok = KimiTokenizer.from_checkpoint(paths)
    names = official_special_names()
    assert tok.special_id("<|im_kimia_text_blank|>") == tok.num_base_tokens + names.index("<|im_kimia_text_blank|>")
    assert tok.vocab_size == tok.num_base_tokens + len(names)


def test_media_ids_must_agree_with_config(tok, paths):
    config = read_json(paths.lm_config)
    config["kimia_media_begin"] = config["kimia_media_begin"] + 1
    with pytest.raises(CheckpointError, match="kimia_media_begin"):
        SpecialTokens.from_tokenizer(tok, config)


def test_offset_below_text_vocab_is_refused(tok, paths):
    config = read_json(paths.lm_config)
    config["kimia_token_offset"] = tok.vocab_size - 1
    with pytest.raises(CheckpointError, match="kimia_token_offset"):
        SpecialTokens.from_tokenizer(tok, config)


def test_tiny_merge_vocabulary_uses_pat_str(tmp_path):
    # A tokenizer with merges: the pre-split regex must keep ' hello' whole (space joins the
    # word) and split digits one by one (official \p{N}, not Llama's \p{N}{1,3}).
    ranks = {bytes([i]): i for i in range(256)}
    for piece in (b"he", b"ll", b"hell", b"hello", b" hello", b"12", b"123"):
        ranks[piece] = len(ranks)
    (tmp_path / "tiktoken.model").write_text("".join(f"{base64.b64encode(k).decode()} {v}\n" for k, v in ranks.items()))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": {str(len(ranks)): {"content": "[BOS]"}}})
    )
    tok = KimiTokenizer.from_checkpoint(CheckpointPaths(root=tmp_path, glm_tokenizer=tmp_path))
    assert tok.encode("a hello") == [ord("a"), ranks[b" hello"]]
    assert tok.encode("123") == [ord("1"), ord("2"), ord("3")]
    assert tok.decode(tok.encode("a hello 123")) == "a hello 123"
