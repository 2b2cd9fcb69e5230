"""GET /v1/models and POST /v1/audio/transcriptions with the official `openai` client against
a real `serve` process on the demo checkpoint: every response_format, streaming, uploads in
several containers, and a burst of concurrent requests batched by the engine. The demo
weights transcribe into gibberish, so the checks compare the formats with each other and
with the greedy (deterministic) json answer, not with words."""

import asyncio
import io
import re
import shutil
import subprocess

import aiohttp
import numpy as np
import pydantic
import pytest

from kimiaudio.audio.io import wav_bytes

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "kimi-audio-7b-instruct"


@pytest.fixture(scope="module")
def speech_files(speech_wav, tmp_path_factory):
    """The same speech as WAV (22.05 kHz, espeak's own), MP3 and Ogg/Opus (made by sox/ffmpeg-free PyAV)."""
    import av

    from kimiaudio.audio.io import load_audio

    pcm = load_audio(speech_wav, sr=24000)
    files = {"wav": speech_wav.read_bytes()}
    for fmt, codec in (("mp3", "libmp3lame"), ("ogg", "libopus")):
        out = io.BytesIO()
        with av.open(out, "w", format=fmt) as container:
            stream = container.add_stream(codec, rate=24000, layout="mono")
            frame = av.AudioFrame.from_ndarray(pcm[None, :], format="flt", layout="mono")
            frame.sample_rate = 24000
            for packet in stream.encode(frame):
                container.mux(packet)
            for packet in stream.encode(None):
                container.mux(packet)
        files[fmt] = out.getvalue()
    return files


async def test_models_lists_the_served_model_and_its_aliases(v1_server, openai_client):
    models = await openai_client.models.list()
    ids = [m.id for m in models.data]
    assert ids[0] == MODEL and {
        "whisper-1",
        "gpt-4o-transcribe",
        "gpt-4o-audio-preview",
        "gpt-4o-realtime-preview",
        "gpt-4o-mini-realtime-preview",
    } <= set(ids)
    for name in (MODEL, "whisper-1"):  # each one listed is there to retrieve
        model = await openai_client.models.retrieve(name)
        assert (model.id, model.object) == (name, "model")
    with pytest.raises(openai.NotFoundError) as info:
        await openai_client.models.retrieve("gpt-4-turbo")
    assert info.value.body["code"] == "model_not_found"


async def test_every_response_format(v1_server, speech_files, openai_client):
    client = openai_client
    audio = ("hello.wav", speech_files["wav"])
    as_json = await client.audio.transcriptions.create(model=MODEL, file=audio)
    text = as_json.text
    assert as_json.usage.seconds >= 2
    # Greedy ASR of the same audio: every format carries the same text.
    plain = await client.audio.transcriptions.create(model=MODEL, file=audio, response_format="text")
    assert plain.strip() == text
    verbose = await client.audio.transcriptions.create(
        model=MODEL, file=audio, response_format="verbose_json", language="en"
    )
    assert verbose.language == "english" and 2.0 < verbose.duration < 4.0
    assert verbose.segments[0].end == verbose.duration
    srt = await client.audio.transcriptions.create(model=MODEL, file=audio, response_format="srt")
    assert re.fullmatch(r"1\n00:00:00,000 --> 00:00:0\d,\d{3}\n(.*)\n\n", srt, re.S).group(1) == text
    vtt = await client.audio.transcriptions.create(model=MODEL, file=audio, response_format="vtt")
    assert re.fullmatch(r"WEBVTT\n\n00:00:00\.000 --> 00:00:0\d\.\d{3}\n(.*)\n\n", vtt, re.S).group(1) == text

    events = [e async for e in await client.audio.transcriptions.create(model=MODEL, file=audio, stream=True)]
    assert events[-1].type == "transcript.text.done" and events[-1].text == text
    assert "".join(e.delta for e in events[:-1]).strip() == text
    usage = events[-1].usage  # in tokens: the instruction and the audio's, and the text's
    assert usage.type == "tokens" and usage.input_tokens > 2 * 12 and usage.output_tokens >= 1
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


async def test_nothing_said_is_an_empty_transcript(v1_server, openai_client):
    """Silence is answered as OpenAI answers it, in every form, without an error; a field that
    is wrong is still refused."""
    from openai.types.audio import TranscriptionVerbose

    client = openai_client
    silent = ("quiet.wav", wav_bytes(np.zeros(16000 * 3, np.float32), 16000))
    as_json = await client.audio.transcriptions.create(model=MODEL, file=silent, include=["logprobs"])
    assert (as_json.text, as_json.logprobs, as_json.usage.seconds) == ("", [], 3)
    assert await client.audio.transcriptions.create(model=MODEL, file=silent, response_format="text") == ""
    assert await client.audio.transcriptions.create(model=MODEL, file=silent, response_format="srt") == ""
    assert await client.audio.transcriptions.create(model=MODEL, file=silent, response_format="vtt") == "WEBVTT\n\n"
    raw = await client.audio.transcriptions.with_raw_response.create(
        model=MODEL, file=silent, response_format="verbose_json", language="en"
    )
    verbose = pydantic.TypeAdapter(TranscriptionVerbose).validate_json(raw.text, strict=True)
    assert (verbose.text, verbose.segments, verbose.language, verbose.duration) == ("", [], "english", 3.0)
    [done] = [e async for e in await client.audio.transcriptions.create(model=MODEL, file=silent, stream=True)]
    assert (done.type, done.text, done.usage.total_tokens) == ("transcript.text.done", "", 0)
    with pytest.raises(openai.BadRequestError) as info:
        await client.audio.transcriptions.create(model=MODEL, file=silent, response_format="docx")
    assert info.value.body["param"] == "response_format"


async def test_verbose_json_holds_every_field_of_the_sdk_model(v1_server, speech_files, openai_client):
    """Validated strictly by the SDK's own TranscriptionVerbose (the SDK itself does not check):
    with no language asked for, and for audio the model writes no text for (one sample)."""
    from openai.types.audio import TranscriptionVerbose

    one_sample = wav_bytes(np.full(1, 0.9, np.float32), 16000)
    for audio in (("speech.wav", speech_files["wav"]), ("one.wav", one_sample)):
        raw = await openai_client.audio.transcriptions.with_raw_response.create(
            model=MODEL, file=audio, response_format="verbose_json"
        )
        verbose = pydantic.TypeAdapter(TranscriptionVerbose).validate_json(raw.text, strict=True)
        assert verbose.language == "undetermined", verbose  # the model names no language it heard
        [segment] = verbose.segments
        if not segment.tokens:  # nothing generated: the neutral mean, no failed decoding
            assert segment.avg_logprob == 0.0 and verbose.text == "", verbose
        else:
            assert segment.avg_logprob <= 0.0, verbose


async def test_containers_and_concurrent_requests_batch(v1_server, speech_files, openai_client):
    client = openai_client
    alone = {
        fmt: (await client.audio.transcriptions.create(model=MODEL, file=(f"speech.{fmt}", data))).text
        for fmt, data in speech_files.items()
    }
    burst = list(speech_files.items()) * 3
    texts = await asyncio.gather(
        *[client.audio.transcriptions.create(model=MODEL, file=(f"speech.{fmt}", data)) for fmt, data in burst]
    )
    # Greedy ASR depends on the audio alone, however the engine batched it.
    assert [t.text for t in texts] == [alone[fmt] for fmt, _ in burst], (alone, [t.text for t in texts])
    async with aiohttp.ClientSession() as http:
        status = await (await http.get(f"{v1_server}/api/status")).json()
    # Nine requests at once: the engine ran several of them in one step.
    assert status["pipeline"]["max_batch_sizes"]["llm"] >= 2, status["pipeline"]
    assert status["pipeline"]["kv_blocks_free"] == status["pipeline"]["kv_blocks_total"]


async def test_bad_uploads_are_openai_errors(v1_server, speech_files, openai_client):
    client = openai_client
    cases = [
        (
            dict(model="gpt-4-turbo", file=("a.wav", speech_files["wav"])),
            openai.NotFoundError,
            "model_not_found",
            "model",
        ),
        (dict(model=MODEL, file=("a.wav", b"not audio at all")), openai.BadRequestError, "invalid_audio", "file"),
        (
            dict(model=MODEL, file=("a.wav", speech_files["wav"]), response_format="docx"),
            openai.BadRequestError,
            "invalid_value",
            "response_format",
        ),
    ]
    for kwargs, error, code, param in cases:
        with pytest.raises(error) as info:
            await client.audio.transcriptions.create(**kwargs)
        body = info.value.body
        assert body["code"] == code and body["param"] == param and body["type"] == "invalid_request_error", body
    # A prompt past what one sequence holds (the test server's KV pool, 4,096 positions, fewer
    # than engine.max_model_len): the client's error.
    with pytest.raises(openai.BadRequestError) as info:
        await client.audio.transcriptions.create(
            model=MODEL, file=("a.wav", speech_files["wav"]), prompt="hello world " * 5000
        )
    assert (info.value.body["code"], info.value.body["param"]) == ("context_length_exceeded", "prompt")
    limit = r"the KV pool's 4096 positions \(fewer than engine.max_model_len, 8192\)"
    assert re.search(rf"prompt of \d+ positions exceeds {limit}", info.value.body["message"]), info.value.body
    assert "turn-" not in info.value.body["message"], info.value.body  # no internal id
    with pytest.raises(openai.BadRequestError) as info:  # streamed: refused before the stream opens
        await client.audio.transcriptions.create(
            model=MODEL, file=("a.wav", speech_files["wav"]), prompt="hello world " * 5000, stream=True
        )
    assert (info.value.status_code, info.value.body["code"]) == (400, "context_length_exceeded")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_example_from_the_readme(v1_server, speech_wav):
    out = subprocess.run(
        [
            "curl",
            "-sS",
            f"{v1_server}/v1/audio/transcriptions",
            "-F",
            f"file=@{speech_wav}",
            "-F",
            f"model={MODEL}",
            "-F",
            "response_format=text",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "error" not in out.stdout, out
