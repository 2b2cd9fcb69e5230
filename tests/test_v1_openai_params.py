"""Every OpenAI request field the /v1 routes take is honoured or refused, never ignored: the
official `openai` client against the shared `serve` process on the demo checkpoint (its
greedy answers are gibberish but deterministic, so the checks compare answers with each
other). Also: OpenAI's model and voice names, measured verbose_json values, and the log line
each /v1 request leaves."""

import base64
import zlib

import numpy as np
import pytest

from kimiaudio.audio.io import wav_bytes

from helpers.audio import silence
from helpers.realtime_events import Events, say
from helpers.waiting import eventually

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "kimi-audio-7b-instruct"


def user_audio(wav: bytes) -> dict:
    return {
        "role": "user",
        "content": [{"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}],
    }


@pytest.fixture(scope="module")
def question(speech_wav) -> bytes:
    return speech_wav.read_bytes()


async def test_chat_sampling_fields_are_honoured(v1_server, question, openai_client):
    async def ask(**fields):
        return await openai_client.chat.completions.create(model=MODEL, messages=[user_audio(question)], **fields)

    greedy = await ask(temperature=0, max_tokens=24, logprobs=True, top_logprobs=3)
    choice = greedy.choices[0]
    text, entries = choice.message.content, choice.logprobs.content
    assert text and entries and len(entries) <= greedy.usage.completion_tokens
    # Real log-probabilities of the tokens of the text: their bytes make the text, each is the
    # likeliest of its alternatives (greedy) and a log-probability.
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == text
    for entry in entries:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.top_logprobs[0].bytes == entry.bytes and entry.top_logprobs[2].logprob <= entry.logprob
    assert len({round(e.logprob, 6) for e in entries}) > 1  # measured, not a constant

    # max_completion_tokens (wins over max_tokens) ends it by length.
    short = await ask(temperature=0, max_tokens=24, max_completion_tokens=4)
    assert short.usage.completion_tokens <= 4 and short.choices[0].finish_reason == "length"
    # More than the server's KV pool (num_kv_blocks below one max_model_len) holds: an answer
    # held to the pool, not a server error.
    roomy = await ask(temperature=0, max_tokens=1_000_000)
    assert roomy.choices[0].finish_reason in ("stop", "length")

    # seed + temperature: reproducible; a tiny top_p keeps only the likeliest token: greedy.
    hot = [await ask(temperature=1.8, seed=7, max_tokens=24) for _ in range(2)]
    hot_text = hot[0].choices[0].message.content
    assert hot_text == hot[1].choices[0].message.content != text
    nucleus = await ask(temperature=1.8, seed=7, max_tokens=24, top_p=1e-6)
    assert nucleus.choices[0].message.content == text
    # OpenAI's ranges reach past the engine's: top_p 0 (the likeliest token alone) and an
    # int64 seed, a negative one being its 64 bits read unsigned.
    assert (await ask(temperature=1.8, seed=7, max_tokens=24, top_p=0)).choices[0].message.content == text
    negative = [await ask(temperature=1.8, seed=seed, max_tokens=24) for seed in (-7, 2**64 - 7)]
    assert negative[0].choices[0].message.content == negative[1].choices[0].message.content

    # stop: the text ends where the stop string begins, and so does generation (the same seed
    # samples the same tokens up to there).
    stop = next(c for c in hot_text[1:] if c.isascii() and c.isprintable())  # the demo's text is mostly bytes
    stopped = await ask(temperature=1.8, seed=7, max_tokens=24, stop=[stop, "never-generated"], logprobs=True)
    assert stopped.choices[0].message.content == hot_text[: hot_text.find(stop)]
    # Its log-probabilities are those of the text kept, even where the text holds U+FFFD for
    # bytes that are no UTF-8 (three bytes each, for one or two of the tokens').
    kept = b"".join(bytes(e.bytes) for e in stopped.choices[0].logprobs.content)
    assert kept.decode("utf-8", "replace") == stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < hot[0].usage.completion_tokens

    # presence / frequency penalties change what is generated after the first repeat.
    penalised = await ask(temperature=0, max_tokens=24, presence_penalty=2.0, frequency_penalty=2.0)
    repeats = len(entries) > len({bytes(e.bytes) for e in entries})
    assert (penalised.choices[0].message.content != text) == repeats

    # Streamed, the logprobs come with the deltas.
    chunks = [c async for c in await ask(temperature=0, max_tokens=24, logprobs=True, stream=True)]
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries])


@pytest.mark.parametrize(
    "fields, param",
    [
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(response_format={"type": "json_object"}), "response_format"),
        (dict(n=2), "n"),
        (dict(logit_bias={"15": 3}), "logit_bias"),
        (dict(top_logprobs=2), "top_logprobs"),  # without logprobs
        (dict(temperature=5), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(seed=-(2**63) - 1), "seed"),
        (dict(presence_penalty=3), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(top_logprobs=21, logprobs=True), "top_logprobs"),
        (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
        (dict(max_completion_tokens=0), "max_completion_tokens"),
        (dict(store=True), "store"),
        (dict(reasoning_effort="low"), "reasoning_effort"),
        (dict(extra_body={"best_of": 3}), "best_of"),
    ],
)
async def test_chat_refuses_what_it_cannot_do(v1_server, question, openai_client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        await openai_client.chat.completions.create(model=MODEL, messages=[user_audio(question)], **fields)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"]


async def test_ignored_fields_are_those_openai_ignores_and_names_map(v1_server, question, openai_client):
    """OpenAI's examples run unchanged: its model and voice names; fields OpenAI itself accepts
    without effect on the answer (user, metadata without store, service_tier auto...)."""
    completion = await openai_client.chat.completions.create(
        model="gpt-4o-audio-preview",
        messages=[user_audio(question)],
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        user="someone",
        metadata={"k": "v"},
        store=False,
        service_tier="auto",
        tools=[],
        max_tokens=20,
    )
    assert completion.choices[0].message.audio.data
    with pytest.raises(openai.NotFoundError) as caught:
        await openai_client.chat.completions.create(model="gpt-4-turbo", messages=[user_audio(question)])
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"


async def test_transcription_fields_are_honoured_and_measured(v1_server, question, openai_client):
    audio = ("hello.wav", question)

    async def transcribe(**fields):
        return await openai_client.audio.transcriptions.create(model="whisper-1", file=audio, **fields)

    verbose = await transcribe(response_format="verbose_json", timestamp_granularities=["segment"])
    with_logprobs = await transcribe(include=["logprobs"])
    segment = verbose.segments[0]
    assert verbose.text == with_logprobs.text and segment.text == verbose.text
    logprobs = [e.logprob for e in with_logprobs.logprobs]
    assert len(segment.tokens) == len(logprobs) > 0
    assert segment.avg_logprob == pytest.approx(sum(logprobs) / len(logprobs)) and segment.avg_logprob < 0
    data = verbose.text.encode()
    assert segment.compression_ratio == pytest.approx(len(data) / len(zlib.compress(data)))
    assert segment.temperature == 0.0 and segment.no_speech_prob < 0.5  # espeak's speech
    assert verbose.language == "undetermined"  # not measured: ISO 639's "und" (not identified), by name

    noise = np.random.default_rng(1).uniform(-0.3, 0.3, 32000).astype(np.float32)
    no_speech = await openai_client.audio.transcriptions.create(
        model="gpt-4o-transcribe", file=("noise.wav", wav_bytes(noise, 16000)), response_format="verbose_json"
    )
    assert no_speech.segments[0].no_speech_prob > 0.5

    hot = await transcribe(response_format="verbose_json", temperature=0.7)
    assert hot.segments[0].temperature == 0.7
    english = await transcribe(response_format="verbose_json", language="EN")
    chinese = await transcribe(response_format="verbose_json", language="zh")
    assert (english.language, chinese.language) == ("english", "chinese")
    # The language picks the instruction, the prompt adds context: each changes the prompt, so
    # the greedy demo weights answer something else.
    assert len({verbose.text, english.text, chinese.text}) == 3
    prompted = await transcribe(prompt="Earlier: the weather report.", include=["logprobs"])
    assert [e.logprob for e in prompted.logprobs] != pytest.approx(logprobs)


@pytest.mark.parametrize(
    "fields, param",
    [
        (dict(language="notalang"), "language"),
        (dict(temperature=5), "temperature"),
        (dict(timestamp_granularities=["word"]), "timestamp_granularities"),
        (dict(timestamp_granularities=["segment"]), "timestamp_granularities"),  # json: no segments
        (dict(include=["logprobs"], response_format="srt"), "include"),
        (dict(chunking_strategy={"type": "server_vad"}), "chunking_strategy"),
        (dict(extra_body={"beam_size": "5"}), "beam_size"),
    ],
)
async def test_transcription_refuses_what_it_cannot_do(v1_server, question, openai_client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        await openai_client.audio.transcriptions.create(model=MODEL, file=("a.wav", question), **fields)
    assert caught.value.body["param"] == param, caught.value.body


async def test_realtime_session_and_response_fields(v1_server, speech, openai_client):
    async with openai_client.beta.realtime.connect(model="gpt-4o-realtime-preview") as conn:
        events = Events(conn, "beta")
        await events.wait_for("session.created")
        for session, param in (
            ({"temperature": 5}, "session.temperature"),
            ({"tool_choice": {"type": "function", "name": "f"}}, "session.tool_choice"),
            ({"input_audio_noise_reduction": {"type": "loud"}}, "session.input_audio_noise_reduction.type"),
            ({"max_response_output_tokens": 0}, "session.max_response_output_tokens"),
        ):
            await conn.send({"type": "session.update", "session": session})
            error = await events.wait_for("error", count=len(events.of_type("error")) + 1)
            assert error.error.param == param, error
        await conn.session.update(
            session={"turn_detection": None, "temperature": 0.9, "max_response_output_tokens": 40}
        )
        updated = await events.wait_for("session.updated")
        assert updated.session.temperature == 0.9 and updated.session.max_response_output_tokens == 40
        await say(conn, np.concatenate([speech[0], silence(0.2)]))
        await conn.input_audio_buffer.commit()
        await events.wait_for("input_audio_buffer.committed")
        await conn.send({"type": "response.create", "response": {"tool_choice": "required"}})
        error = await events.wait_for("error", count=len(events.of_type("error")) + 1)
        assert error.error.param == "response.tool_choice"
        await conn.response.create(
            response={
                "tools": [{"type": "function", "name": "f"}],  # (taken, never called)
                "modalities": ["text"],
                "instructions": "Be brief.",
                "temperature": 0.7,
                "max_output_tokens": 3,
                "voice": "alloy",
            }
        )
        done = await events.wait_for("response.done")
        assert done.response.status in ("completed", "incomplete")
        assert done.response.output[0].content[0].type == "text"
        said = "".join(e.delta for e in events.of_type("response.text.delta") if e.response_id == done.response.id)
        assert done.response.output[0].content[0].text == said == done.response.model_extra["text"], done
        assert 0 < done.response.usage.output_tokens <= 3


async def test_every_v1_request_leaves_one_log_line(v1_serve, question, openai_client):
    proc, _ = v1_serve
    before = len(proc.output_lines)
    await openai_client.audio.transcriptions.create(model=MODEL, file=("a.wav", question))
    with pytest.raises(openai.BadRequestError):
        await openai_client.chat.completions.create(
            model=MODEL,
            messages=[user_audio(question)],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    spoken = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[user_audio(question)],
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        max_tokens=30,
    )
    assert spoken.choices[0].message.audio.data

    # The server writes each line once the request has ended: its output may trail the answer,
    # and so may the line of an earlier test's Realtime WebSocket (a GET, written as it closes).
    async def request_lines():
        lines = [line for line in proc.output_lines[before:] if "kimiaudio.requests" in line and " POST " in line]
        return lines if len(lines) >= 3 else None

    lines = await eventually(request_lines, "three kimiaudio.requests log lines")
    assert len(lines) == 3, lines
    assert "INFO" in lines[0] and "POST /v1/audio/transcriptions status=200 audio_in_s=2." in lines[0], lines
    assert "first_byte_s=" in lines[0] and "audio_out_s" not in lines[0], lines
    assert "POST /v1/chat/completions status=400 refused=unsupported_parameter param=tools" in lines[1], lines
    fields = dict(pair.split("=") for pair in lines[2].split("status=200 ")[1].split())
    assert float(fields["audio_in_s"]) > 1 and float(fields["audio_out_s"]) > 0
    assert 0 < float(fields["first_byte_s"]) <= float(fields["done_s"])


async def test_a_realtime_websockets_log_line_times_its_upgrade(v1_serve, openai_client):
    """Its first_byte_s is the 101's, not the connection's length (done_s, written as it closes)."""
    proc, _ = v1_serve
    before = len(proc.output_lines)
    async with openai_client.realtime.connect(model=MODEL) as conn:
        events = Events(conn, "ga")
        created = await events.wait_for("session.created")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
        )
        await conn.response.create(response={"max_output_tokens": 2, "output_modalities": ["text"]})
        done = await events.wait_for("response.done")
    open_s = events.arrived[events.position(done)] - events.arrived[events.position(created)]

    async def websocket_line():  # written as the handler returns, after its session's close
        lines = proc.output_lines[before:]
        closed = next((i for i, line in enumerate(lines) if f"session {created.session.id} closed" in line), None)
        after = [line for line in lines[closed or 0 :] if "GET /v1/realtime status=101" in line]
        return after[0] if closed is not None and after else None

    fields = dict(pair.split("=") for pair in (await eventually(websocket_line, "its log line")).split()[-2:])
    # The upgrade left before session.created, and the socket closed after response.done came.
    assert float(fields["done_s"]) - float(fields["first_byte_s"]) >= open_s - 0.002, (fields, open_s)
