"""The audio one /v1/chat/completions request may bring, limited as its parts are decoded, with
the official `openai` client against a real `serve` process: each message's parts together
up to audio.max_input_seconds (120 s), every message's together up to what
engine.max_model_len holds (8192 positions at 12.5 a second: 655.36 s). The first part past
either is refused by its path, and no later part is read: a junk part after it would be an
`invalid_audio` of its own, were it decoded."""

import base64
import io

import numpy as np
import pytest
import soundfile

from kimiaudio.audio import pcm16
from kimiaudio.audio.io import wav_bytes
from kimiaudio.config import Config
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.inputs.audio_allowance import message_allowance, request_allowance
from kimiaudio.server.inputs.audio_input import speech_from_bytes

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "kimi-audio-7b-instruct"
JUNK = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF junk").decode(), "format": "wav"}}


def tone(seconds: float, fmt: str = "wav") -> dict:
    """An input_audio part of a quiet tone (8 kHz WAV: cheap to send and to decode; or pcm16)."""
    rate = 24000 if fmt == "pcm16" else 8000
    pcm = (0.3 * np.sin(np.arange(int(seconds * rate)) * 0.1)).astype(np.float32)
    data = pcm16.to_bytes(pcm) if fmt == "pcm16" else wav_bytes(pcm, rate)
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def test_a_part_is_decoded_against_what_is_left_and_spends_it():
    """Ten minutes of a tone in a few kilobytes of FLAC, with 5 s left of the request's 655.36 s:
    refused as the request's, before the rest is decoded; a part that fits is taken off both."""
    config = Config()
    buffer = io.BytesIO()
    soundfile.write(buffer, np.full(8000 * 600, 0.25, np.float32), 8000, subtype="PCM_16", format="FLAC")
    message, request = message_allowance(config), request_allowance(config, 12.5)  # (Kimi-Audio's rate)
    request.take(request.total - 5)
    with pytest.raises(ApiError) as info:
        speech_from_bytes(buffer.getvalue(), None, config.audio, "p", allowances=(message, request))
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "p") and message.left == 120
    assert info.value.message.startswith("p: the request's audio parts together last more than 655.36 s")
    fits = pcm16.to_bytes(np.full(24000 * 3, 0.25, np.float32))
    assert speech_from_bytes(fits, "pcm16", config.audio, "p", allowances=(message, request)).size == 3 * 16000
    assert (message.left, request.left) == pytest.approx((117, 2))
    with pytest.raises(ApiError) as info:  # raw pcm16 past what is left: measured, never converted
        speech_from_bytes(fits, "pcm16", config.audio, "p", allowances=(message, request))
    assert info.value.code == "context_length_exceeded" and (message.left, request.left) == pytest.approx((117, 2))


async def refusal(openai_client, messages: list[dict]) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        await openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    return info.value.body


async def test_a_message_s_parts_share_one_limit_spent_as_they_are_decoded(v1_server, openai_client):
    error = await refusal(openai_client, [{"role": "user", "content": [tone(61), tone(61), JUNK]}])
    assert (error["code"], error["param"]) == ("invalid_audio", "messages[0].content[1].input_audio.data"), error
    assert "this message's audio parts together last more than 120 s (audio.max_input_seconds)" in error["message"]
    # Raw pcm16 too is measured before it is converted, against what the message has left.
    error = await refusal(openai_client, [{"role": "user", "content": [tone(100), tone(30, "pcm16"), JUNK]}])
    assert (error["code"], error["param"]) == ("invalid_audio", "messages[0].content[1].input_audio.data"), error


async def test_the_request_s_audio_is_limited_across_its_messages(v1_server, openai_client):
    """Six history messages of 110 s each (each within its own 120 s): the sixth passes what
    8192 positions hold, refused as the prompt would have been, before the last message is read."""
    history = [
        message
        for _ in range(6)
        for message in ({"role": "user", "content": [tone(110)]}, {"role": "assistant", "content": "Yes."})
    ]
    error = await refusal(openai_client, [*history, {"role": "user", "content": [JUNK]}])
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages[10].content[0].input_audio.data")
    assert "the request's audio parts together last more than 655.36 s" in error["message"], error
    assert "engine.max_model_len is 8192 positions" in error["message"], error
    # Within both limits, history audio and several parts are answered.
    messages = [*history[:2], {"role": "user", "content": [tone(50), tone(60)]}]
    completion = await openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert completion.usage.prompt_tokens > 12.5 * 220, completion.usage
