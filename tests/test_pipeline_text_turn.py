"""A written user turn (TurnRequest.user_text): the request holds exactly one of the user's
audio and text; its prompt is the official one for a user text message (no goldens hold one:
the layout is checked position by position against KIMI_AUDIO_REFERENCE.md §3, with the golden
checkpoint's tokenizer and ids); on the demo checkpoint the pipeline answers it, text and
speech, exactly as the offline reference answers the same messages."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.lm_turn import LmTurn
from kimiaudio.pipeline.offline import answer
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.text.prompt import Message, build_prompt

from helpers.golden_text import golden_text
from helpers.pipeline_turns import load_demo_stack, run_turn, settled_stats, with_pipeline


@pytest.fixture(scope="module")
def text_side(golden_paths):
    return golden_text(golden_paths)


@pytest.fixture(scope="module")
def tok(text_side):
    return text_side[0]


@pytest.fixture(scope="module")
def sp(text_side):
    return text_side[1]


def test_a_turn_is_spoken_or_written_not_both_nor_neither():
    pcm = np.zeros(16000, np.float32)
    with pytest.raises(KimiAudioError, match="exactly one of them.*neither"):
        TurnRequest("c", [])
    with pytest.raises(KimiAudioError, match="exactly one of them.*both"):
        TurnRequest("c", [], pcm, user_text="hello")
    with pytest.raises(KimiAudioError, match="text is empty"):
        TurnRequest("c", [], user_text="")
    assert TurnRequest("c", [], user_text="hello").user_audio is None
    assert TurnRequest("c", [], pcm).user_text is None


def prompt_of(request: TurnRequest, output_type: str, tok, sp):
    loop = asyncio.new_event_loop()  # the handle's; nothing is delivered to it here
    turn = LmTurn(TurnHandle("t", loop), request, {}, 0.0)
    loop.close()
    return build_prompt(turn.messages(), output_type, tok, sp)


@pytest.mark.parametrize("output_type", ["both", "text"])
def test_a_written_turn_is_the_official_user_text_message(tok, sp, output_type):
    """[user_msg_start|B] [B|t_i]... [msg_end|B] [assistant_msg_start|B]: no media, and no
    ct/ctd (those follow only an audio message that ends the user's run), for either output."""
    text = "Tell me a story."
    prompt = prompt_of(TurnRequest("c", [], user_text=text, output_type=output_type), output_type, tok, sp)
    ids = tok.encode(text)
    blank = sp.text_blank
    assert prompt.audio_ids == [sp.user_msg_start] + [blank] * len(ids) + [sp.msg_end, sp.assistant_msg_start]
    assert prompt.text_ids == [blank] + ids + [blank, blank]
    assert prompt.continuous_mask == [0] * len(prompt) and prompt.features_tensor() is None


def test_a_written_turn_after_history_starts_the_users_run(tok, sp):
    """After an assistant answer the role changes: the user's prefix, its text, msg_end, then
    the generation prefix; the instructions before it are a user text turn of an earlier run."""
    history = [HistoryTurn("user", text="Be brief."), HistoryTurn("assistant", text="OK.")]
    text = "Why is the sky blue?"
    written = prompt_of(TurnRequest("c", history, user_text=text), "both", tok, sp)
    earlier = build_prompt(
        [Message("user", "text", text="Be brief."), Message("assistant", "text", text="OK.")], "both", tok, sp
    )
    head = len(earlier) - 1  # without its generation prefix
    assert written.audio_ids[:head] == earlier.audio_ids[:head] and written.text_ids[:head] == earlier.text_ids[:head]
    ids, blank = tok.encode(text), sp.text_blank
    assert written.audio_ids[head:] == [sp.user_msg_start] + [blank] * len(ids) + [sp.msg_end, sp.assistant_msg_start]
    assert written.text_ids[head:] == [blank] + ids + [blank, blank]


@pytest.fixture(scope="module")
def stack(demo_checkpoint):
    return load_demo_stack(demo_checkpoint)


@pytest.mark.parametrize("output_type", ["both", "text"])
def test_the_pipeline_answers_a_written_turn_like_the_offline_reference(stack, output_type):
    params = SamplingParams.from_config(stack.config.sampling, seed=5, max_new_tokens=40)
    history = [HistoryTurn("user", text="Be brief.")]
    request = TurnRequest("c", history, user_text="Tell me a story.", sampling=params, output_type=output_type)

    async def body(pipeline):
        return await run_turn(pipeline, request), await settled_stats(pipeline)

    got, stats = with_pipeline(stack, body)
    done = got["done"]
    assert done.status == "completed" and done.error is None
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    # Nothing was spoken, so nothing was encoded: no UserEncoded, and no encoder stage ran.
    assert got["codes"] is None and stats["max_batch_sizes"].get("encode", 0) == 0
    messages = [Message("user", "text", text="Be brief."), Message("user", "text", text="Tell me a story.")]
    reference = answer(stack, messages, params, output_type)
    assert got["text"] == reference.text == done.text
    if output_type == "both":
        speech = reference.codes(stack.specials.token_offset)
        assert speech and done.audio_tokens == speech
        wav = stack.detokenizer.detokenize(speech, seed=params.seed).numpy()
        np.testing.assert_allclose(got["pcm"], wav, atol=1e-4, rtol=1e-4)
    else:
        assert done.audio_tokens == [] and got["pcm"].size == 0
