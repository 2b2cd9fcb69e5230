"""The two shapes of the Realtime events (session/event_shape.py): every event the server
builds, as a GA and as a beta connection gets it, holds under the official SDK's models of that
shape checked strictly (helpers/openai_strict.py), with the names each shape uses; the session
objects of both shapes, realtime and transcription, and a turn_detection object replacing the
last one whole; events only WebRTC has."""

import json

import pytest

from kimiaudio.config import Config
from kimiaudio.pipeline.events import TurnDone
from kimiaudio.server.session import response_events, server_events
from kimiaudio.server.session.client_events import parse_client_event
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.event_shape import event_shape
from kimiaudio.server.session.session_settings import SessionSettings

from helpers.openai_strict import check

pytest.importorskip("openai")


def session_events(settings: SessionSettings, shape) -> list[dict]:
    """session.created and session.updated as the connection of `shape` gets them."""
    sent: list[dict] = []
    sender = EventSender("sess_1", lambda: None, sent.append, shape=shape)
    session = shape.session(settings, "sess_1", "conv_1")
    for event in (server_events.session_created(session), server_events.session_updated(session)):
        sender.send(event)
    return sent


def every_event(spoken: bool) -> list[dict]:
    """One of each event the server builds, in a response's order."""
    user = server_events.message_item("item_u", "user", "", has_audio=True, index=0)
    typed = server_events.message_item("item_t", "user", "Hello.", index=1)
    added = server_events.message_item("item_a", "assistant", status="in_progress")
    final = server_events.message_item("item_a", "assistant", "Hi there.", spoken, index=2)
    cut = server_events.message_item(
        "item_a", "assistant", "Hi", spoken, index=2, interrupted=True, status="incomplete"
    )
    response = response_events.response_object("resp_1", "conv_1", spoken, "alloy", None)
    done = TurnDone("completed", "Hi there.", [1, 2, 3], prefill_tokens_computed=40, prefill_tokens_cached=8)
    delta = response_events.transcript_delta if spoken else response_events.text_delta
    return [
        server_events.speech_started(100, "item_u"),
        server_events.speech_stopped(900, "item_u"),
        server_events.committed("conv_1", 0, 0.8, "item_u", None),
        server_events.conversation_created("conv_1"),
        server_events.item_added("conv_1", user, None),
        server_events.item_done("conv_1", user, None),
        server_events.item_added("conv_1", typed, "item_u"),
        server_events.transcription_delta("item_u", 0, "hel"),
        server_events.transcription_completed("item_u", 0, "hello", 0.8),
        server_events.transcription_failed("item_u", 0, "the transcription failed (no result)"),
        response_events.response_created(response),
        response_events.output_item_added("resp_1", added),
        server_events.item_added("conv_1", added, "item_t"),
        response_events.content_part_added("resp_1", "item_a", spoken),
        response_events.audio_buffer("started", "resp_1"),
        delta("resp_1", "item_a", "Hi"),
        response_events.audio_delta("resp_1", "item_a", "AAAA"),
        *response_events.text_done("resp_1", "item_a", "Hi there.", spoken),
        response_events.content_part_done("resp_1", "item_a", spoken, "Hi there."),
        response_events.output_item_done("resp_1", final),
        server_events.item_done("conv_1", final, "item_t"),
        response_events.response_done(
            response,
            "completed",
            "Hi there.",
            {"done_s": 1.0},
            output=[final],
            usage=response_events.response_usage(done),
        ),
        response_events.audio_buffer("stopped", "resp_1"),
        response_events.response_done(response, "cancelled", "Hi", {}, output=[cut], reason="turn_detected"),
        response_events.audio_buffer("cleared", "resp_1"),
        response_events.response_done(response, "failed", "", {}, "too long", error_code="context_length_exceeded"),
        response_events.response_done(response, "failed", "", {}, "the GPU worker stopped"),
        server_events.item_truncated("item_a", 300),
        server_events.buffer_cleared(),
        server_events.error("invalid_value", "session.voice: no such voice", "session.voice"),
    ]


@pytest.mark.parametrize("api", ["ga", "beta"])
@pytest.mark.parametrize("webrtc", [False, True])
@pytest.mark.parametrize("spoken", [True, False])
def test_every_event_holds_under_the_sdk_models_of_its_shape(api, webrtc, spoken):
    sent: list[dict] = []
    sender = EventSender("sess_1", lambda: "conv_1", sent.append, shape=event_shape(api, webrtc))
    for event in every_event(spoken):
        sender.send(event)
    for event in sent:
        check(json.loads(json.dumps(event)), api)
    kinds = [e["type"] for e in sent]
    assert [e["event_id"] for e in sent] == [f"evt_{i}" for i in range(1, len(sent) + 1)]
    assert any(k.startswith("output_audio_buffer.") for k in kinds) == webrtc  # the server plays it only there
    if api == "ga":
        assert "conversation.item.done" in kinds and "conversation.item.created" not in kinds
        assert ("response.output_audio_transcript.delta" if spoken else "response.output_text.delta") in kinds
        final = next(e for e in sent if e["type"] == "response.output_item.done")["item"]
        assert final["content"][0]["type"] == ("output_audio" if spoken else "output_text")
    else:
        assert "conversation.item.done" not in kinds and "conversation.item.added" not in kinds
        assert ("response.audio_transcript.delta" if spoken else "response.text.delta") in kinds
        assert "response.audio.delta" in kinds and "response.output_audio.delta" not in kinds
        final = next(e for e in sent if e["type"] == "response.output_item.done")["item"]
        assert final["content"][0]["type"] == ("audio" if spoken else "text")
        created = next(e for e in sent if e["type"] == "response.created")["response"]
        assert created["modalities"] == (["text", "audio"] if spoken else ["text"]) and created["voice"] == "alloy"
    cancelled = [e for e in sent if e["type"] == "response.done"][1]["response"]["status_details"]
    assert cancelled == {"type": "cancelled", "reason": "turn_detected"}
    failed = [e for e in sent if e["type"] == "response.done"][2]["response"]["status_details"]
    assert "reason" not in failed and failed["error"]["code"] == "context_length_exceeded"


def update(settings: SessionSettings, session: dict, kind: str = "session.update") -> None:
    settings.apply(parse_client_event(json.dumps({"type": kind, "session": session})))


@pytest.mark.parametrize("api", ["ga", "beta"])
def test_session_objects_of_both_shapes_and_both_types(api):
    shape = event_shape(api)
    settings = SessionSettings(Config(), can_speak=True)
    for event in session_events(settings, shape):
        check(event, api)
    session = shape.session(settings, "sess_1", None)
    if api == "ga":
        assert session["type"] == "realtime" and session["output_modalities"] == ["audio"]
        assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        assert session["audio"]["output"]["voice"] == settings.voice
    else:
        assert "type" not in session and session["modalities"] == ["text", "audio"]
        assert session["turn_detection"]["type"] == "server_vad" and session["voice"] == settings.voice

    # 16 kHz input (kimiaudio's): OpenAI's format object says 24000 only, so it says no rate then.
    update(settings, {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}, "turn_detection": None})
    for event in session_events(settings, shape):
        check(event, api)
    session = shape.session(settings, "sess_1", None)
    assert session["input_audio_rate"] == 16000
    if api == "ga":
        assert session["audio"]["input"]["format"] == {"type": "audio/pcm"}
        assert session["audio"]["input"]["turn_detection"] is None

    # A transcription session: GA's session.update type, or beta's transcription_session.update.
    if api == "ga":
        update(settings, {"type": "transcription", "audio": {"input": {"transcription": {"language": "de"}}}})
    else:
        update(settings, {"input_audio_transcription": {"language": "de"}}, "transcription_session.update")
    assert settings.kind == "transcription" and settings.transcription.language == "de"
    sent = session_events(settings, shape)
    for event in sent:
        check(event, api)
    if api == "ga":
        assert sent[1]["type"] == "session.updated" and sent[1]["session"]["type"] == "transcription"
        assert sent[1]["session"]["audio"]["input"]["transcription"]["language"] == "de"
    else:
        assert sent[1]["type"] == "transcription_session.updated"
        assert sent[1]["session"]["input_audio_transcription"] == {"language": "de", "prompt": ""}


@pytest.mark.parametrize("api", ["ga", "beta"])
def test_a_turn_detection_object_replaces_the_last_one_whole(api):
    """OpenAI's turn_detection is one object: the fields an update leaves out take the server's
    values again, not those of an earlier update (a switch to semantic_vad inherits nothing)."""
    shape = event_shape(api)
    server = Config()
    settings = SessionSettings(server, can_speak=True)

    def turn_detection() -> dict:
        session = shape.session(settings, "sess_1", None)
        return session["audio"]["input"]["turn_detection"] if api == "ga" else session["turn_detection"]

    def detect(value: dict) -> None:
        update(settings, {"audio": {"input": {"turn_detection": value}}} if api == "ga" else {"turn_detection": value})

    custom = {"threshold": 0.9, "silence_duration_ms": 1500, "prefix_padding_ms": 100, "idle_timeout_ms": 6000}
    detect({"type": "server_vad", **custom, "interrupt_response": False, "create_response": False})
    assert {key: turn_detection()[key] for key in custom} == custom
    assert not settings.config.vad.barge_in and not settings.create_response
    detect({"type": "server_vad", "threshold": 0.3})
    assert turn_detection() == {
        "type": "server_vad",
        "threshold": 0.3,
        "silence_duration_ms": server.vad.silence_ms,
        "prefix_padding_ms": server.vad.prefix_padding_ms,
        "idle_timeout_ms": None,
        "create_response": True,
        "interrupt_response": server.vad.barge_in,
    }
    detect({"type": "server_vad", **custom, "interrupt_response": False, "create_response": False})
    detect({"type": "semantic_vad"})  # (served by the same VAD: its settings are the server's again)
    vad = settings.config.vad
    assert (vad.threshold, vad.silence_ms, vad.prefix_padding_ms, vad.barge_in) == (
        server.vad.threshold,
        server.vad.silence_ms,
        server.vad.prefix_padding_ms,
        server.vad.barge_in,
    )
    assert turn_detection()["interrupt_response"] == server.vad.barge_in and settings.create_response
    update(settings, {"vad": {"min_speech_ms": 400}})  # kimiaudio's own [vad] keys are no part of it
    detect({"type": "server_vad"})
    assert settings.config.vad.min_speech_ms == 400 and turn_detection()["threshold"] == server.vad.threshold
    for event in session_events(settings, shape):
        check(event, api)


def test_unknown_shape_is_refused():
    with pytest.raises(ValueError, match="ga"):
        event_shape("v2")
