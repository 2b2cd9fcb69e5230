"""Tokenizer and special tokens against the golden checkpoint's tokenizer files."""

import base64
import json
import shutil
from pathlib import Path

import pytest

from kimiaudio.checkpoint.files import read_json

from kimiaudio.checkpoint.paths import CheckpointPaths, find_checkpoint
from kimiaudio.errors import CheckpointError
from kimiaudio.text.special_tokens import SpecialTokens, official_special_names
from kimiaudio.text.tokenizer import KimiTokenizer

GOLDEN = Path(__file__).parent / "data" / "golden_a"
CHECKPOINT = GOLDEN / "checkpoint"


@pytest.fixture(scope="module")
def paths():
    return find_checkpoint(CHECKPOINT)


@pytest.fixture(scope="module")
def tok(paths):
    return KimiTokenizer.from_checkpoint(paths)


def _copy_tokenizer_files(tmp_path: Path) -> CheckpointPaths:
    for name in ("tiktoken.model", "tokenizer_config.json", "config.json"):
        shutil.copy(CHECKPOINT / name, tmp_path / name)
    return CheckpointPaths(root=tmp_path, glm_tokenizer=tmp_path / "glm-4-voice-tokenizer")


def test_special_ids_follow_tokenizer_config(tok, paths):
    decoder = read_json(paths.tokenizer_config)["added_tokens_decoder"]
    for key, entry in decoder.items():
        assert tok.special_id(entry["content"]) == int(key)
    specials = SpecialTokens.from_tokenizer(tok, read_json(paths.lm_config))
    meta = json.loads((GOLDEN / "golden.meta.json").read_text())
    expected = meta["special_tokens"]
    assert specials.msg_end == expected["msg_end"]
    assert specials.media_begin == expected["media_begin"]
    assert specials.media_end == expected["media_end"]
    assert specials.text_blank == expected["kimia_text_blank"]
    assert specials.text_eos == expected["kimia_text_eos"]
    assert specials.user_msg_start == expected["kimia_user_msg_start"]
    assert specials.assistant_msg_start == expected["kimia_assistant_msg_start"]
    assert specials.speech_ct == expected["kimia_speech_ct_id"]
    assert specials.speech_ctd == expected["kimia_speech_ctd_id"]
    assert specials.token_offset == meta["kimia_token_offset"]
    assert tok.vocab_size == meta["kimia_token_offset"]


def test_golden_special_order_is_the_official_one(tok):
    # The tiny golden tokenizer numbers its 64 specials in the official order after 256 bytes.
    for i, name in enumerate(official_special_names(64)):
        assert tok.special_id(name) == 256 + i


def test_official_count_matches_real_offset():
    assert 151643 + len(official_special_names()) == 152064


def test_encode_matches_golden_prompt_text(tok):
    from safetensors.torch import load_file

    text_stream = load_file(str(GOLDEN / "golden.safetensors"))["lm.text.input.text_input_ids"][0].tolist()
    # [blank] + instruction tokens + blanks: the instruction is 'ASR 请转写'
    ids = tok.encode("ASR 请转写")
    assert text_stream[1 : 1 + len(ids)] == ids
    assert ids == list("ASR 请转写".encode("utf-8"))  # byte-level tiny vocabulary


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


def test_malformed_tiktoken_names_file_and_line(tmp_path):
    paths = _copy_tokenizer_files(tmp_path)
    lines = paths.tiktoken_model.read_text().splitlines()
    lines[4] = "not-base64!! 4"
    paths.tiktoken_model.write_text("\n".join(lines) + "\n")
    with pytest.raises(CheckpointError, match=r"tiktoken.model: line 5"):
        KimiTokenizer.from_checkpoint(paths)


def test_special_id_inside_ranks_is_refused(tmp_path):
    paths = _copy_tokenizer_files(tmp_path)
    config = json.loads(paths.tokenizer_config.read_text())
    config["added_tokens_decoder"]["12"] = {"content": "<|bad|>"}
    paths.tokenizer_config.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="tokenizer_config.json.*'12'"):
        KimiTokenizer.from_checkpoint(paths)


def test_without_added_tokens_decoder_uses_official_numbering(tmp_path):
    paths = _copy_tokenizer_files(tmp_path)
    config = json.loads(paths.tokenizer_config.read_text())
    del config["added_tokens_decoder"]
    paths.tokenizer_config.write_text(json.dumps(config))
    tok = KimiTokenizer.from_checkpoint(paths)
    assert tok.special_id("<|im_kimia_text_blank|>") == 279
    assert tok.vocab_size == 256 + 421


def test_media_ids_must_agree_with_config(tok, paths):
    config = read_json(paths.lm_config)
    config["kimia_media_begin"] = config["kimia_media_begin"] + 1
    with pytest.raises(CheckpointError, match="kimia_media_begin"):
        SpecialTokens.from_tokenizer(tok, config)


def test_offset_below_text_vocab_is_refused(tok, paths):
    config = read_json(paths.lm_config)
    config["kimia_token_offset"] = 300
    with pytest.raises(CheckpointError, match="kimia_token_offset"):
        SpecialTokens.from_tokenizer(tok, config)


def test_tiny_merge_vocabulary_uses_pat_str(tmp_path):
    # A tokenizer with merges: the pre-split regex must keep ' hello' whole (space joins the
    # word) and split digits one by one (official \p{N}, not Llama's \p{N}{1,3}).
    ranks = {bytes([i]): i for i in range(256)}
    for piece in (b"he", b"ll", b"hell", b"hello", b" hello", b"12", b"123"):
        ranks[piece] = len(ranks)
    (tmp_path / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(k).decode()} {v}\n" for k, v in ranks.items())
    )
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": {str(len(ranks)): {"content": "[BOS]"}}})
    )
    tok = KimiTokenizer.from_checkpoint(CheckpointPaths(root=tmp_path, glm_tokenizer=tmp_path))
    assert tok.encode("a hello") == [ord("a"), ranks[b" hello"]]
    assert tok.encode("123") == [ord("1"), ord("2"), ord("3")]
    assert tok.decode(tok.encode("a hello 123")) == "a hello 123"
