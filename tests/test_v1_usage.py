"""OpenAI's token usage details, read with the official `openai` client from a real `serve` on
the demo checkpoint: chat's prompt_tokens_details and completion_tokens_details (streamed with
stream_options.include_usage too) count what the turn held, the question's speech codes and
the answer's speech codes and text tokens, and the model's reasoning and predicted outputs,
which it has none of, as 0; a Realtime response.done's input_token_details and
output_token_details count the same, in both shapes; a streamed transcription's
transcript.text.done counts its instruction's and its audio's tokens apart."""

import base64
import wave

import pytest

from helpers.realtime_sessions import APIS, connect, open_session, user_audio

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "kimi-audio-7b-instruct"
SEED = 3  # the demo weights speak to the test sentence with this seed
TEXT_SEED = 8  # the demo weights write text (sampled at temperature 1.5) to the text-only question
SAMPLES_PER_CODE = 24000 * 2 // 25  # a speech code is 80 ms of 24 kHz audio
CODES_PER_SECOND = 12.5


def seconds(path) -> float:
    with wave.open(str(path)) as wav:
        return wav.getnframes() / wav.getframerate()


def spoken_question(path) -> list[dict]:
    data = base64.b64encode(path.read_bytes()).decode()
    return [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}]


def check_spoken(usage, pcm_bytes: int, transcript: str, question_s: float) -> None:
    prompt, completion = usage.prompt_tokens_details, usage.completion_tokens_details
    # The question's codes, one per 80 ms (the encoder may round at either end).
    assert abs(prompt.audio_tokens - question_s * CODES_PER_SECOND) <= 2, (prompt, question_s)
    assert prompt.audio_tokens < usage.prompt_tokens and prompt.cached_tokens is not None
    assert completion.audio_tokens * SAMPLES_PER_CODE * 2 == pcm_bytes, (completion, pcm_bytes)
    assert (completion.text_tokens > 0) == bool(transcript), (completion, transcript)
    assert completion.text_tokens <= usage.completion_tokens
    assert completion.reasoning_tokens == completion.accepted_prediction_tokens == 0
    assert completion.rejected_prediction_tokens == 0


async def test_a_spoken_answer_counts_its_codes_and_text(v1_server, speech_wav, openai_client):
    completion = await openai_client.chat.completions.create(
        model=MODEL,
        messages=spoken_question(speech_wav),
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        seed=SEED,
    )
    audio = completion.choices[0].message.audio
    check_spoken(completion.usage, len(base64.b64decode(audio.data)), audio.transcript, seconds(speech_wav))


async def test_a_streamed_answer_counts_them_in_its_usage_chunk(v1_server, speech_wav, openai_client):
    stream = await openai_client.chat.completions.create(
        model=MODEL,
        messages=spoken_question(speech_wav),
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        seed=SEED,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    pieces = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    pcm_bytes = sum(len(base64.b64decode(p.data)) for p in pieces if p.data)
    transcript = "".join(p.transcript or "" for p in pieces)
    check_spoken(chunks[-1].usage, pcm_bytes, transcript, seconds(speech_wav))


async def test_a_written_answer_has_no_audio_tokens(v1_server, openai_client):
    completion = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a joke."}],
        max_tokens=20,
        temperature=1.5,
        seed=TEXT_SEED,
    )
    usage = completion.usage
    assert completion.choices[0].message.content
    assert usage.prompt_tokens_details.audio_tokens == usage.completion_tokens_details.audio_tokens == 0
    assert 0 < usage.completion_tokens_details.text_tokens <= usage.completion_tokens


@pytest.mark.parametrize("api", APIS)
async def test_a_realtime_answer_counts_its_codes_and_text(v1_server, speech_16k, openai_client, api):
    async with connect(openai_client, api) as conn:
        events = await open_session(conn, api, turn_detection=None, instructions="Answer briefly.")
        await conn.conversation.item.create(item=user_audio(speech_16k))
        await conn.response.create()
        done = await events.wait_for("response.done")
        usage = done.response.usage
        audio_s = events.audio_seconds(done.response.id)
    assert done.response.status in ("completed", "incomplete"), done
    given, made = usage.input_token_details, usage.output_token_details
    assert abs(given.audio_tokens - speech_16k.size / 16000 * CODES_PER_SECOND) <= 2, given
    assert 0 < given.text_tokens < usage.input_tokens and given.cached_tokens is not None
    assert made.audio_tokens == round(audio_s * CODES_PER_SECOND) > 0, (made, audio_s)
    assert 0 <= made.text_tokens <= usage.output_tokens


async def test_a_streamed_transcription_counts_its_audio_and_text(v1_server, speech_wav, openai_client):
    stream = await openai_client.audio.transcriptions.create(
        model="gpt-4o-transcribe", file=speech_wav.open("rb"), stream=True
    )
    done = [event async for event in stream][-1]
    assert done.type == "transcript.text.done"
    given = done.usage.input_token_details
    assert abs(given.audio_tokens - seconds(speech_wav) * CODES_PER_SECOND) <= 2, given
    assert 0 < given.text_tokens and given.audio_tokens + given.text_tokens <= done.usage.input_tokens
