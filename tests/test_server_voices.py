"""The voices API on the server with the real pipeline (demo checkpoint): upload a voice made
with espeak-ng, list it, speak a chat completion in it through the `openai` client, pick it in
session.update, delete it; bad uploads and unknown voices get 4xx with a message."""

from __future__ import annotations

import base64
import io
import logging
import subprocess

import av
import numpy as np
import pytest
import soundfile

from kimiaudio.audio.io import load_audio, wav_bytes

from helpers.demo_server import kv_pool_full_again
from helpers.voice_upload import form

openai = pytest.importorskip("openai")


@pytest.fixture
async def served(demo_server):
    async with demo_server() as (client, pipeline):
        yield client, pipeline


async def error(resp, status: int, code: str) -> str:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert body["error"]["code"] == code and body["error"]["message"]
    return body["error"]["message"]


def flac(pcm: np.ndarray, sr: int) -> bytes:
    """A FLAC file (any container PyAV reads must do)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=sr, layout="mono")
        frame = av.AudioFrame.from_ndarray((pcm * 32767).astype(np.int16)[None], format="s16", layout="mono")
        frame.sample_rate = sr
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


def float_wav(pcm: np.ndarray, sr: int) -> bytes:
    """A float WAV file: its samples as they are, however far past full scale."""
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm.astype(np.float32), sr, subtype="FLOAT", format="WAV")
    return buffer.getvalue()


async def chat(client, voice: str | dict, question: bytes, seed: int = 3):
    return await client.chat.completions.create(
        model="kimi-audio-7b-instruct",
        modalities=["text", "audio"],
        audio={"voice": voice, "format": "wav"},
        seed=seed,
        max_tokens=30,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_audio",
                        "input_audio": {"data": base64.b64encode(question).decode(), "format": "wav"},
                    }
                ],
            }
        ],
    )


async def test_voice_lifecycle(served, espeak_voice, speech_wav):
    http, pipeline = served
    pcm = load_audio(espeak_voice, 22050)
    resp = await http.post("/api/voices", data=form("espeak", flac(pcm, 22050), "voice.flac"))
    assert resp.status == 201, await resp.text()
    added = await resp.json()
    assert added["name"] == "espeak" and abs(added["seconds"] - pcm.size / 22050) < 0.05 and added["num_codes"] > 0
    listed = await (await http.get("/api/voices")).json()
    assert [v["name"] for v in listed["voices"]] == ["espeak"] and "alloy" in listed["stock"]
    built = pipeline.stats()["voice_prefixes_built"]
    assert built == 1  # computed when added

    # Closed within the test: left to the garbage collector, its connection pool would be closed
    # on an event loop that is gone, an ERROR in whatever test runs then.
    client = openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key="unused", max_retries=0)
    try:
        await _speak_in_the_voice(http, pipeline, client, speech_wav, espeak_voice, built)
    finally:
        await client.close()
    await kv_pool_full_again(pipeline)


async def _speak_in_the_voice(http, pipeline, client, speech_wav, espeak_voice, built) -> None:
    question = speech_wav.read_bytes()
    spoken = await chat(client, "espeak", question)
    plain = await chat(client, "alloy", question)  # a stock name: the model's own voice, as before
    a, b = spoken.choices[0].message.audio, plain.choices[0].message.audio
    assert a.transcript == b.transcript  # the LM is untouched by the voice ...
    wav_a, wav_b = base64.b64decode(a.data), base64.b64decode(b.data)
    assert len(wav_a) == len(wav_b) > 1000 and wav_a != wav_b  # ... its speech is not
    assert pipeline.requests[-2].voice.name == "espeak" and pipeline.requests[-1].voice is None
    assert pipeline.stats()["voice_prefixes_built"] == built  # the turn used the kept prefix
    by_id = await chat(client, {"id": "espeak"}, question)  # OpenAI's custom voice object names it too
    assert base64.b64decode(by_id.choices[0].message.audio.data)
    # (the voice the turn was given, not the bytes: on a loaded machine the detokenizer's
    # real-time guard may chunk the same answer otherwise)
    assert pipeline.requests[-1].voice.name == "espeak"
    assert pipeline.requests[-1].voice.name == "espeak"

    with pytest.raises(openai.BadRequestError, match="unknown voice 'nobody'"):
        await chat(client, "nobody", question)
    await error(await http.post("/api/voices", data=form("espeak", espeak_voice.read_bytes())), 409, "voice_exists")

    resp = await http.delete("/api/voices/espeak")
    assert resp.status == 200 and (await resp.json())["deleted"] == "espeak"
    assert (await (await http.get("/api/voices")).json())["voices"] == []
    await error(await http.delete("/api/voices/espeak"), 404, "not_found")
    long_name = await error(await http.delete("/api/voices/" + "x" * 5000), 404, "not_found")
    assert len(long_name) < 300, len(long_name)  # the name as long as a voice's may be, not all of it
    with pytest.raises(openai.BadRequestError, match="unknown voice 'espeak'"):
        await chat(client, "espeak", question)


async def test_voice_survives_a_restart(espeak_voice, demo_server):
    async with demo_server() as (http, _):
        assert (await http.post("/api/voices", data=form("kept", espeak_voice.read_bytes()))).status == 201
    async with demo_server() as (http, pipeline):
        listed = await (await http.get("/api/voices")).json()
        assert [v["name"] for v in listed["voices"]] == ["kept"]
        assert pipeline.voices.resolve("kept").codes  # registered again from the store


@pytest.mark.parametrize(
    "case, status, code",
    [
        ("too_short", 400, "too_short"),
        ("too_long", 400, "too_long"),
        ("silent", 400, "silent"),
        ("undecodable", 400, "undecodable"),
        ("out_of_range", 400, "undecodable"),
        ("no_file", 400, "missing_required_parameter"),
        ("no_name", 400, "missing_required_parameter"),
        ("bad_name", 400, "invalid_name"),
        ("model_voice_name", 400, "invalid_name"),
        ("json", 415, "unsupported_media_type"),
    ],
)
async def test_bad_uploads(served, case, status, code):
    http, pipeline = served
    sr = 24000
    tone = (0.3 * np.sin(np.arange(sr * 4) * 0.05)).astype(np.float32)
    bodies = {
        "too_short": form("short", wav_bytes(tone[: sr // 2], sr)),
        "too_long": form("long", wav_bytes(np.tile(tone, 9), sr)),
        "silent": form("quiet", wav_bytes(np.zeros(sr * 4, np.float32), sr)),
        "undecodable": form("junk", b"this is not audio at all" * 100),
        "out_of_range": form("loud", float_wav(tone * 1e30, sr)),
        "no_file": form("nofile", None),
        "no_name": form(None, wav_bytes(tone, sr)),
        "bad_name": form("../etc", wav_bytes(tone, sr)),
        "model_voice_name": form("Kimi", wav_bytes(tone, sr)),
    }
    if case == "json":
        resp = await http.post("/api/voices", json={"name": "x"})
    else:
        resp = await http.post("/api/voices", data=bodies[case])
    message = await error(resp, status, code)
    assert "Traceback" not in message
    assert (await (await http.get("/api/voices")).json())["voices"] == []
    assert pipeline.stats()["voice_prefixes_built"] == 0


async def test_realtime_session_picks_a_voice(served, espeak_voice, speech_16k):
    """session.update `voice` over /v1/realtime: an unknown name (or custom voice id) is an error
    event and changes nothing; a stored one, by its name or as `{"id": name}`, is used for the
    session's next answer."""
    from kimiaudio.audio import pcm16
    from kimiaudio.audio.resampling import resample

    http, pipeline = served
    assert (await http.post("/api/voices", data=form("espeak", espeak_voice.read_bytes()))).status == 201
    async with http.ws_connect("/v1/realtime?model=kimi-audio-7b-instruct") as ws:

        async def next_of(kind: str) -> dict:
            while True:
                event = await ws.receive_json(timeout=120)
                if event["type"] in (kind, "error"):
                    return event

        assert (await next_of("session.created"))["session"]["audio"]["output"]["voice"] == "kimi"
        await ws.send_json({"type": "session.update", "session": {"voice": "nobody"}})
        bad = await next_of("session.updated")
        assert bad["type"] == "error" and "unknown voice 'nobody'" in bad["error"]["message"]
        assert bad["error"]["param"] == "session.voice"
        for voice, words in (({"id": "nobody"}, "unknown voice 'nobody'"), ({"id": 5}, 'a voice name or {"id": name}')):
            await ws.send_json({"type": "session.update", "session": {"audio": {"output": {"voice": voice}}}})
            bad = await next_of("session.updated")
            assert bad["type"] == "error" and words in bad["error"]["message"], bad
            assert bad["error"]["param"] == "session.audio.output.voice"
        # A custom voice object (OpenAI's GA shape) names a stored voice by its name.
        update = {"audio": {"output": {"voice": {"id": "espeak"}}}, "turn_detection": None}
        await ws.send_json({"type": "session.update", "session": update})
        assert (await next_of("session.updated"))["session"]["audio"]["output"]["voice"] == "espeak"
        audio = base64.b64encode(pcm16.to_bytes(resample(speech_16k, 16000, 24000))).decode()
        await ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
        await ws.send_json({"type": "input_audio_buffer.commit"})
        await ws.send_json({"type": "response.create"})
        done = await next_of("response.done")
        assert done["type"] == "response.done", done
    assert pipeline.requests[-1].voice.name == "espeak"


async def test_an_openai_voice_setting_naming_no_stored_voice_is_said_at_start(demo_server, espeak_voice, caplog):
    """`[server] openai_voice` names the voice every request naming alloy, echo... speaks in: a
    typo there fails all of them, so the start says so, as it does for `[voices] default`;
    once the voice is stored, the next start says nothing."""
    with caplog.at_level(logging.ERROR, logger="kimiaudio.server.stored_voices"):
        async with demo_server(openai_voice="narrator") as (http, _):
            assert (await http.post("/api/voices", data=form("narrator", espeak_voice.read_bytes()))).status == 201
        said = [r.getMessage() for r in caplog.records]
        caplog.clear()
        async with demo_server(openai_voice="narrator"):
            pass
    assert len(said) == 1 and "server.openai_voice = 'narrator' is not a stored voice" in said[0], said
    assert "OpenAI voice" in said[0]
    assert [r.getMessage() for r in caplog.records] == []


async def test_the_voice_openai_voice_names_is_not_deleted(demo_server, espeak_voice, speech_wav):
    """Deleting the voice `[server] openai_voice` names would fail every request naming alloy,
    echo... from then on (with an error naming a voice the client never asked for): refused,
    as for `[voices] default`, and such requests go on speaking in it."""
    async with demo_server(openai_voice="narrator") as (http, pipeline):
        assert (await http.post("/api/voices", data=form("narrator", espeak_voice.read_bytes()))).status == 201
        message = await error(await http.delete("/api/voices/narrator"), 409, "default_voice")
        assert "server.openai_voice" in message
        assert [v["name"] for v in (await (await http.get("/api/voices")).json())["voices"]] == ["narrator"]
        client = openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key="unused", max_retries=0)
        try:
            spoken = await chat(client, "alloy", speech_wav.read_bytes())
        finally:
            await client.close()
        assert base64.b64decode(spoken.choices[0].message.audio.data)
        assert pipeline.requests[-1].voice.name == "narrator"


def mp3(pcm: np.ndarray, sr: int) -> bytes:
    """An MP3 file as FFmpeg writes one (an ID3v2 tag, then the frames)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=sr, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm[None].astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = sr
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=sr)
        for packet in [p for f in resampler.resample(frame) for p in stream.encode(f)] + stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize("damage", ["cut_short", "joined"])
async def test_a_recording_with_a_damaged_packet_is_a_voice(served, espeak_voice, tmp_path, damage):
    """A recording players play, though a packet of it does not decode: a FLAC file cut short
    (its recorder stopped mid-write), or two MP3 files joined end to end (`cat`: the second's
    tag lies mid-stream). The packets that decode make the voice."""
    http, _ = served
    whole = soundfile.info(str(espeak_voice)).duration
    if damage == "cut_short":
        path = tmp_path / "voice.flac"
        subprocess.run(["sox", str(espeak_voice), str(path)], check=True)
        damaged, most, filename = path.read_bytes()[:-700], whole, "voice.flac"
    else:
        one = mp3(load_audio(espeak_voice, 22050), 22050)
        damaged, most, filename = one + one, 2 * whole + 0.2, "voice.mp3"
    resp = await http.post("/api/voices", data=form("damaged", damaged, filename))
    assert resp.status == 201, await resp.text()
    assert whole - 1 < (await resp.json())["seconds"] <= most
