"""POST /v1/chat/completions with the official `openai` client against a real `serve` process
on the demo checkpoint: text answers, spoken answers in every format (decoded with PyAV, not
silent), a last user message of text alone answered in text or in speech, streaming (audio
leaves before the answer ends), earlier answers named by audio id, and a client that
disconnects mid-answer (its KV blocks are free within a second)."""

import base64
import io
import time

import aiohttp
import av
import numpy as np
import pytest

from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "kimi-audio-7b-instruct"
SEED = 3  # the demo weights speak for a second or more to the test sentence with this seed
TEXT_SEED = 8  # the demo weights write text (sampled at temperature 1.5) to the text-only question


def user_audio(wav: bytes, text: str | None = None) -> dict:
    parts = [{"type": "text", "text": text}] if text else []
    return {
        "role": "user",
        "content": parts
        + [{"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}],
    }


def decode(data: bytes, fmt: str) -> np.ndarray:
    """Float mono samples of an answer (pcm16: raw 24 kHz s16le)."""
    if fmt == "pcm16":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        return np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])


@pytest.fixture(scope="module")
def question(speech_wav) -> bytes:
    return speech_wav.read_bytes()


async def status(base_url: str) -> dict:
    async with aiohttp.ClientSession() as http:
        return (await (await http.get(f"{base_url}/api/status")).json())["pipeline"]


async def test_text_answer(v1_server, question, openai_client):
    completion = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, user_audio(question, "Answer this:")],
        max_tokens=30,
    )
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.message.audio is None and choice.finish_reason in ("stop", "length")
    # The prompt held the system text, the user text and the audio: more than the audio's codes.
    assert completion.usage.prompt_tokens > 30 and 0 < completion.usage.completion_tokens <= 30


async def test_a_text_only_turn_is_answered_in_text(v1_server, question, openai_client):
    """A last user message of text alone is the turn to answer (the official prompt's user text
    message). Sampled text: the demo's greedy text ends at once (TEXT_SEED: it writes some)."""
    completion = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a joke."}],
        max_tokens=20,
        temperature=1.5,
        seed=TEXT_SEED,
    )
    choice = completion.choices[0]
    assert choice.message.content and choice.message.audio is None and choice.finish_reason in ("stop", "length")
    assert 0 < completion.usage.completion_tokens <= 20
    spoken = await openai_client.chat.completions.create(
        model=MODEL, messages=[user_audio(question)], max_tokens=1, seed=SEED
    )
    # Two short texts and the role markers: fewer positions than the spoken question's codes.
    assert 0 < completion.usage.prompt_tokens < spoken.usage.prompt_tokens


async def test_a_text_only_turn_is_answered_in_speech(v1_server, openai_client):
    completion = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me a joke."}]}],
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        seed=SEED,
    )
    message = completion.choices[0].message
    assert message.content is None and message.audio.id.startswith("audio_")
    assert isinstance(message.audio.transcript, str)
    pcm = decode(base64.b64decode(message.audio.data), "wav")
    assert pcm.size > 0 and np.abs(pcm).max() > 0.01, pcm.size


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "aac", "flac", "pcm16"])
async def test_spoken_answer_in_every_format(v1_server, question, fmt, openai_client):
    completion = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[user_audio(question)],
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": fmt},
        seed=SEED,
    )
    message = completion.choices[0].message
    assert message.content is None and message.audio.id.startswith("audio_")
    assert message.audio.expires_at > time.time() + 3000
    pcm = decode(base64.b64decode(message.audio.data), fmt)
    assert pcm.size > 0.5 * 24000 and np.abs(pcm).max() > 0.01, (fmt, pcm.size)


async def test_streamed_spoken_answer_and_audio_id_history(v1_server, question, openai_client):
    client = openai_client
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[user_audio(question)],
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"},
        seed=SEED,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks, arrived = [], []
    async for chunk in stream:
        chunks.append(chunk)
        arrived.append(time.monotonic())
    audio = [(c.choices[0].delta.audio, t) for c, t in zip(chunks, arrived) if c.choices and c.choices[0].delta.audio]
    data = [a for a, _ in audio if a.data]
    pcm = decode(b"".join(base64.b64decode(a.data) for a in data), "pcm16")
    assert pcm.size > 0.5 * 24000 and np.abs(pcm).max() > 0.01
    # Audio left in pieces as it was made: the first before the answer was finished.
    first_data = next(t for a, t in audio if a.data)
    finished = next(t for c, t in zip(chunks, arrived) if c.choices and c.choices[0].finish_reason)
    assert len(data) >= 2 and first_data < finished - 0.05, (len(data), finished - first_data)
    answer_id = audio[0][0].id
    assert {a.id for a, _ in audio} == {answer_id} and audio[-1][0].expires_at > time.time()
    assert chunks[-1].usage.completion_tokens > 0 and not chunks[-1].choices

    # The answer, named by its id, is the history of the next request.
    follow = await client.chat.completions.create(
        model=MODEL,
        messages=[user_audio(question), {"role": "assistant", "audio": {"id": answer_id}}, user_audio(question)],
        max_tokens=10,
    )
    assert follow.usage.prompt_tokens > 2 * chunks[-1].usage.prompt_tokens - 10
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model=MODEL,
            messages=[
                user_audio(question),
                {"role": "assistant", "audio": {"id": "audio_unknown"}},
                user_audio(question),
            ],
        )
    assert info.value.body["code"] == "audio_not_found" and info.value.body["param"] == "messages[1].audio.id"


async def test_prompt_past_max_model_len_is_the_clients_error(v1_server, question, openai_client):
    """Too long a history is refused as OpenAI refuses it (400 context_length_exceeded), not a 500."""
    with pytest.raises(openai.BadRequestError) as info:
        await openai_client.chat.completions.create(
            model=MODEL,
            max_tokens=2,
            messages=[{"role": "system", "content": "hello world " * 5000}, user_audio(question)],
        )
    body = info.value.body
    assert (body["code"], body["param"], body["type"]) == (
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
    )
    assert "engine.max_model_len" in body["message"] and "turn-" not in body["message"], body  # no internal id
    with pytest.raises(openai.BadRequestError) as info:  # streamed: refused before the stream opens
        await openai_client.chat.completions.create(
            model=MODEL,
            max_tokens=2,
            stream=True,
            messages=[{"role": "system", "content": "hello world " * 5000}, user_audio(question)],
        )
    assert (info.value.status_code, info.value.body["code"]) == (400, "context_length_exceeded")


async def test_client_disconnect_mid_answer_frees_its_kv_at_once(v1_server, question):
    before = await status(v1_server)
    body = {
        "model": MODEL,
        "messages": [user_audio(question)],
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "mp3"},
        "stream": True,
        "max_tokens": 400,
    }
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{v1_server}/v1/chat/completions", json=body)
        assert resp.status == 200
        first = await resp.content.readuntil(b"\n\n")
        assert first.startswith(b"data: ")

        async def running():
            return (await status(v1_server))["running"]

        await eventually(running, "the turn in the engine", interval=0.02)
        resp.close()  # drop the connection mid-answer

    async def settled():
        now = await status(v1_server)
        return now if now["kv_blocks_free"] == now["kv_blocks_total"] and now["turns"] == 0 else None

    now = await eventually(settled, "every KV block free again", interval=0.02)
    # At once: the turn was cancelled (its blocks freed then), not left to generate its 400 tokens
    # (proven by its status, not by a clock: a loaded machine may take long to free them).
    assert now["turns_by_status"].get("cancelled", 0) == before["turns_by_status"].get("cancelled", 0) + 1
