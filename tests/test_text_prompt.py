"""Prompt builder: rebuild the official golden prompts exactly, and check multi-turn layout."""

import pytest
import torch

from kimiaudio.checkpoint.files import read_json
from kimiaudio.errors import AudioInputError, KimiAudioError
from kimiaudio.text.prompt import Message, Prompt, build_prompt
from kimiaudio.text.special_tokens import SpecialTokens
from kimiaudio.text.tokenizer import KimiTokenizer


@pytest.fixture(scope="module")
def tok(golden_paths):
    return KimiTokenizer.from_checkpoint(golden_paths)


@pytest.fixture(scope="module")
def sp(tok, golden_paths):
    return SpecialTokens.from_tokenizer(tok, read_json(golden_paths.lm_config))


def golden_instruction(tok, golden, section: str) -> str:
    """The user text of a golden prompt: its text stream without the blanks around it."""
    return tok.decode(golden[f"{section}.input.text_input_ids"][0].tolist())


def _codes_between_markers(audio_ids: list[int], sp: SpecialTokens) -> list[int]:
    begin, end = audio_ids.index(sp.media_begin), audio_ids.index(sp.media_end)
    return [a - sp.token_offset for a in audio_ids[begin + 1 : end]]


@pytest.mark.parametrize("prefix,output_type", [("lm.text", "text"), ("lm.both", "both"), ("lm_e2e", "both")])
def test_rebuilds_official_golden_prompt(golden, tok, sp, prefix, output_type):
    audio = golden[f"{prefix}.input.audio_input_ids"][0].tolist()
    feature = golden[f"{prefix}.input.whisper_feature"]  # [1, N, adaptor_dim]
    codes = _codes_between_markers(audio, sp)
    messages = [
        Message("user", "text", text=golden_instruction(tok, golden, prefix)),
        Message("user", "audio", audio_tokens=codes, features=feature[0]),
    ]
    prompt = build_prompt(messages, output_type, tok, sp)
    assert prompt.audio_ids == audio
    assert prompt.text_ids == golden[f"{prefix}.input.text_input_ids"][0].tolist()
    assert prompt.continuous_mask == golden[f"{prefix}.input.is_continuous_mask"][0].tolist()
    assert torch.equal(prompt.features_tensor(), feature[0])


def test_e2e_codes_are_the_golden_glm_tokens(golden, sp):
    codes = _codes_between_markers(golden["lm_e2e.input.audio_input_ids"][0].tolist(), sp)
    assert codes == golden["glm4.tokens"][0].tolist()


def _runs(prompt: Prompt, sp: SpecialTokens):
    return [i for i, a in enumerate(prompt.audio_ids) if a == sp.msg_end]


def test_multi_turn_audio_text_history(tok, sp):
    dim = 8
    q1, a1, q2 = [1, 2, 3], [4, 5, 6, 7, 8], [9, 10]
    messages = [
        Message("user", "audio", audio_tokens=q1, features=torch.randn(3, dim)),
        Message("assistant", "audio-text", text="ok", audio_tokens=a1),
        Message("user", "audio", audio_tokens=q2, features=torch.randn(2, dim)),
    ]
    p = build_prompt(messages, "both", tok, sp)
    B, off = sp.text_blank, sp.token_offset
    user1 = [sp.user_msg_start, sp.media_begin, *[c + off for c in q1], sp.media_end, sp.speech_ctd, sp.msg_end]
    assistant = [sp.assistant_msg_start, *[B] * sp.audio_delay, *[c + off for c in a1], sp.msg_end]
    user2 = [sp.user_msg_start, sp.media_begin, *[c + off for c in q2], sp.media_end, sp.speech_ctd, sp.msg_end]
    assert p.audio_ids == user1 + assistant + user2 + [sp.assistant_msg_start]
    # text stream: blanks except the assistant text, which starts right after its role prefix
    start = len(user1) + 1
    text = tok.encode("ok")
    assert p.text_ids[start : start + len(text)] == text
    assert all(t == B for i, t in enumerate(p.text_ids) if not start <= i < start + len(text))
    # only the user audio codes are continuous; one feature row each
    assert sum(p.continuous_mask) == len(q1) + len(q2) == p.features_tensor().shape[0]
    assert all(p.continuous_mask[i] == 0 for i in range(len(user1), len(user1) + len(assistant)))
    assert len(p.audio_ids) == len(p.text_ids) == len(p.continuous_mask)


def test_role_prefix_and_ct_only_at_role_changes(tok, sp):
    messages = [
        Message("user", "audio", audio_tokens=[1]),
        Message("user", "audio", audio_tokens=[2]),
        Message("user", "text", text="hi"),
        Message("assistant", "text", text="yo"),
    ]
    p = build_prompt(messages, "text", tok, sp)
    assert p.audio_ids.count(sp.user_msg_start) == 1
    assert p.audio_ids.count(sp.assistant_msg_start) == 2  # assistant run + generation prefix
    # neither audio ends the user run (the text does), so no ct token at all
    assert sp.speech_ct not in p.audio_ids and sp.speech_ctd not in p.audio_ids
    assert p.audio_ids.count(sp.msg_end) == 2
    # assistant text ends with the text EOS, the user text does not
    eos_positions = [i for i, t in enumerate(p.text_ids) if t == sp.text_eos]
    assert len(eos_positions) == 1
    assert p.text_ids[eos_positions[0] - len(tok.encode("yo")) : eos_positions[0]] == tok.encode("yo")
    assert p.audio_ids[eos_positions[0] + 1] == sp.msg_end
    assert p.features == [] and p.features_tensor() is None


def test_ct_marks_last_audio_of_run(tok, sp):
    messages = [Message("user", "text", text="q"), Message("user", "audio", audio_tokens=[3, 4])]
    p_text = build_prompt(messages, "text", tok, sp)
    p_both = build_prompt(messages, "both", tok, sp)
    assert p_text.audio_ids[-3:] == [sp.speech_ct, sp.msg_end, sp.assistant_msg_start]
    assert p_both.audio_ids[-3:] == [sp.speech_ctd, sp.msg_end, sp.assistant_msg_start]


def test_audio_text_longer_text_pads_audio_stream(tok, sp):
    text = "a long answer text"
    codes = [1, 2]
    p = build_prompt([Message("assistant", "audio-text", text=text, audio_tokens=codes)], "both", tok, sp)
    body_audio, body_text = p.audio_ids[1:-2], p.text_ids[1:-2]  # strip prefix, msg_end, gen prefix
    assert body_text == tok.encode(text)  # nothing cut
    expected = [sp.text_blank] * sp.audio_delay + [c + sp.token_offset for c in codes]
    assert body_audio == expected + [sp.text_blank] * (len(body_text) - len(expected))


def test_feature_count_mismatch_is_refused(tok, sp):
    with pytest.raises(AudioInputError, match="2 whisper feature rows for 3 audio codes"):
        build_prompt([Message("user", "audio", audio_tokens=[1, 2, 3], features=torch.zeros(2, 4))], "both", tok, sp)
    prompt = Prompt([1, 2], [3, 4], [1, 1], [torch.zeros(1, 4)])
    with pytest.raises(AudioInputError, match="2 continuous"):
        prompt.validate()


def test_bad_messages_are_refused(tok, sp):
    with pytest.raises(KimiAudioError, match="role"):
        build_prompt([Message("system", "text", text="x")], "text", tok, sp)
    with pytest.raises(KimiAudioError, match="output_type"):
        build_prompt([Message("user", "text", text="x")], "speech", tok, sp)
    with pytest.raises(AudioInputError, match="out of range"):
        build_prompt([Message("user", "audio", audio_tokens=[sp.num_audio_codes])], "text", tok, sp)
    with pytest.raises(AudioInputError, match="non-empty"):
        build_prompt([Message("user", "audio", audio_tokens=[])], "text", tok, sp)
