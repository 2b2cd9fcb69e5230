"""The real-time protocol: server event builders (server_events.py, response_events.py), their
numbering (event_sender.py) and client event parsing (client_events.py), in kimiaudio's own
shape and in the OpenAI Realtime beta and GA shapes (the shapes of server events:
test_server_event_shapes.py)."""

import base64
import json
import re

import pytest

from kimiaudio.server.session import response_events, server_events
from kimiaudio.server.session.client_events import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    ConversationSelect,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    ProtocolError,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    parse_client_event,
)
from kimiaudio.server.session.event_sender import EventSender
from kimiaudio.server.session.session_update import AnswerUpdate, Transcription, TurnUpdate


def test_client_events_parse():
    assert parse_client_event('{"type": "response.cancel"}') == ResponseCancel()
    assert parse_client_event(b'{"type": "conversation.select", "conversation_id": null}') == ConversationSelect(None)
    assert parse_client_event('{"type": "conversation.select", "conversation_id": "abc"}') == ConversationSelect("abc")
    update = parse_client_event(
        json.dumps(
            {
                "type": "session.update",
                "event_id": "e1",
                "session": {"vad": {"threshold": 0.6}, "sampling": {"audio_temperature": 0.5}, "output_type": "text"},
            }
        )
    )
    assert update == SessionUpdate(TurnUpdate({"threshold": 0.6}), AnswerUpdate({"audio_temperature": 0.5}, "text"))
    audio = base64.b64encode(b"\x01\x00\xff\x7f").decode()
    assert parse_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": audio})) == AudioAppend(
        b"\x01\x00\xff\x7f"
    )
    assert parse_client_event('{"type": "input_audio_buffer.commit"}') == AudioCommit()
    assert parse_client_event('{"type": "input_audio_buffer.clear", "event_id": "x"}') == AudioClear()
    assert parse_client_event('{"type": "response.create", "response": {"modalities": ["text"]}}') == ResponseCreate(
        "text"
    )
    assert parse_client_event(
        '{"type": "conversation.item.truncate", "item_id": "i1", "content_index": 0, "audio_end_ms": 1500}'
    ) == ItemTruncate("i1", 1500)
    item = parse_client_event(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Be brief."}, {"type": "input_audio", "audio": audio}],
                },
            }
        )
    )
    assert item == ItemCreate("user", "Be brief.", b"\x01\x00\xff\x7f")
    spoken_first = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}
    spoken_first["content"] += [{"type": "input_text", "text": "Is this English?"}]
    item = parse_client_event(json.dumps({"type": "conversation.item.create", "item": spoken_first}))
    assert item == ItemCreate("user", "Is this English?", b"\x01\x00\xff\x7f", audio_first=True)
    assert parse_client_event('{"type": "conversation.item.retrieve", "item_id": "i1"}') == ItemRetrieve("i1")
    assert parse_client_event('{"type": "conversation.item.delete", "item_id": "i1"}') == ItemDelete("i1")


def test_openai_session_update_beta_and_ga_shapes():
    beta = parse_client_event(
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "modalities": ["audio", "text"],
                    "instructions": "Answer briefly.",
                    "voice": "alloy",
                    "input_audio_format": "pcm16",
                    "output_audio_format": "pcm16",
                    "input_audio_transcription": None,
                    "turn_detection": {
                        "type": "server_vad",
                        "threshold": 0.7,
                        "silence_duration_ms": 300,
                        "prefix_padding_ms": 200,
                        "create_response": False,
                        "interrupt_response": True,
                    },
                    "tools": [],
                    "tool_choice": "auto",
                    "temperature": 0.8,
                    "max_response_output_tokens": 200,
                },
            }
        )
    )
    assert beta == SessionUpdate(
        turns=TurnUpdate(
            vad={"threshold": 0.7, "silence_ms": 300, "prefix_padding_ms": 200, "barge_in": True},
            detection="server_vad",
            create_response=False,
            resets=("threshold", "silence_ms", "prefix_padding_ms", "barge_in"),
        ),
        answers=AnswerUpdate(
            sampling={"max_new_tokens": 200},
            output_type="both",
            instructions="Answer briefly.",
            voice="alloy",
            temperature=0.8,
            tool_choice="auto",
        ),
        input_rate=24000,
        transcription=False,
    )  # input_audio_transcription: null = off
    ga = parse_client_event(
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "output_modalities": ["text"],
                    "audio": {
                        "input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None},
                        "output": {"voice": "marin"},
                    },
                },
            }
        )
    )
    assert (ga.answers.output_type, ga.turns.detection, ga.input_rate, ga.answers.voice) == (
        "text",
        "none",
        16000,
        "marin",
    )


def test_input_audio_transcription_beta_and_ga_shapes():
    def update(session):
        return parse_client_event(json.dumps({"type": "session.update", "session": session}))

    assert update({}).transcription is None  # unchanged
    assert update({"input_audio_transcription": {"model": "whisper-1"}}).transcription == Transcription("whisper-1")
    ga = {"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe", "language": "EN", "prompt": "Ada"}}}}
    assert update(ga).transcription == Transcription("gpt-4o-transcribe", "en", "Ada")
    assert update({"audio": {"input": {"transcription": None}}}).transcription is False
    assert update({"type": "transcription"}).kind == "transcription" and update({}).kind is None
    for session, param in (
        ({"input_audio_transcription": "on"}, "session.input_audio_transcription"),
        ({"input_audio_transcription": {"model": 5}}, "session.input_audio_transcription.model"),
        ({"input_audio_transcription": {"language": "klingon"}}, "session.input_audio_transcription.language"),
        ({"audio": {"input": {"transcription": {"delay": "low"}}}}, "session.audio.input.transcription.delay"),
        ({"audio": {"input": {"transcription": {"languages": ["en"]}}}}, "session.audio.input.transcription.languages"),
        ({"type": "translation"}, "session.type"),
    ):
        with pytest.raises(ProtocolError) as info:
            update(session)
        assert info.value.param == param


@pytest.mark.parametrize(
    "message, code, words",
    [
        ("{not json", "invalid_json", "not valid JSON"),
        (b"\xff\xfe", "invalid_json", "UTF-8"),
        ("[1]", "invalid_event", "JSON object"),
        ('{"type": "response.explode"}', "unknown_event", "response.cancel"),
        ('{"kind": "x"}', "unknown_event", "None"),
        ('{"type": ["response.cancel"]}', "unknown_event", "['response.cancel']"),
        ('{"type": {"conversation.item.delete": 1}}', "unknown_event", "unknown event type {"),
        ('{"type": "conversation.item.delete"}', "missing_required_parameter", "item_id is required"),
        ('{"type": "conversation.item.retrieve", "item_id": 7}', "invalid_value", "item_id: expected an item id"),
        (
            '{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text", '
            '"text": "a"}, {"type": "input_audio", "audio": "AQD/fw=="}, {"type": "input_text", "text": "b"}]}}',
            "unsupported",
            "all before or all after",
        ),
        ('{"type": "conversation.select", "conversation_id": 5}', "invalid_event", "conversation_id"),
        ('{"type": "conversation.select"}', "missing_required_parameter", "null starts a new conversation"),
        ('{"type": "session.update", "session": {"vad": "fast"}}', "invalid_event", "session.vad"),
        ('{"type": "session.update", "session": {"output_type": "audio"}}', "invalid_event", "output_type"),
        ('{"type": "session.update", "session": {"modalities": ["video"]}}', "invalid_value", "modalities"),
        ('{"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}', "unsupported_format", "pcm16"),
        (
            '{"type": "session.update", "session": {"turn_detection": {"threshold": "high"}}}',
            "invalid_value",
            "threshold",
        ),
        ('{"type": "session.update", "session": {"turn_detection": {"type": "magic"}}}', "invalid_value", "server_vad"),
        # A type of null is no mode: the message names the modes, and how to turn detection off.
        (
            '{"type": "session.update", "session": {"turn_detection": {"type": null}}}',
            "invalid_value",
            'expected "server_vad" or "semantic_vad" (turn_detection null turns it off), got None',
        ),
        ('{"type": "input_audio_buffer.append", "audio": "not base64!"}', "invalid_audio", "base64"),
        (
            '{"type": "conversation.item.create", "item": {"role": "user", '
            '"content": [{"type": "input_audio", "audio": "AAAA"}]}}',
            "invalid_audio",
            "even",
        ),
        ('{"type": "conversation.item.create", "item": {"type": "function_call"}}', "unsupported", "message"),
        ('{"type": "conversation.item.create", "item": {"role": "user", "content": []}}', "invalid_value", "content"),
        ('{"type": "conversation.item.truncate", "item_id": "x", "audio_end_ms": -1}', "invalid_value", "audio_end_ms"),
        ('{"type": "conversation.item.truncate"}', "missing_required_parameter", "item_id is required"),
        ('{"type": "conversation.item.truncate", "item_id": "x"}', "missing_required_parameter", "audio_end_ms is"),
        (
            '{"type": "conversation.item.create", '
            '"item": {"role": "user", "content": [{"type": "input_text", "text": null}]}}',
            "missing_required_parameter",
            "content[0].text is required",
        ),
        (
            '{"type": "conversation.item.create", "item": {"role": "user", "content": [{"type": "input_text"}]}}',
            "missing_required_parameter",
            "content[0].text is required",
        ),
        (
            '{"type": "conversation.item.create", '
            '"item": {"role": "user", "content": [{"type": "input_text", "text": "a\\u0000"}]}}',
            "invalid_value",
            "content[0].text",
        ),
        ('{"type": "session.update", "session": {"audio": []}}', "invalid_event", "session.audio"),
        ('{"type": "session.update"}', "missing_required_parameter", "session is required"),
        ('{"type": "transcription_session.update"}', "missing_required_parameter", "session is required"),
        ('{"type": "response.create", "response": []}', "invalid_event", "response"),
        ("[" * 100 + "]" * 100, "invalid_json", "nested"),
        ("x" * 70000, "invalid_event", "too large"),
    ],
)
def test_bad_client_events_have_clear_errors(message, code, words):
    with pytest.raises(ProtocolError) as info:
        parse_client_event(message)
    assert info.value.code == code and words in str(info.value)


def test_openai_fields_are_honoured_refused_or_ignored_as_openai_does():
    """What asks for nothing passes (an echo of session.created, no tools); what asks for
    something kimiaudio cannot do is refused naming it; an unknown field too."""
    update = parse_client_event(
        '{"type": "session.update", "session": {"tools": [], "tool_choice": "none", "client_secret": {}}}'
    )
    assert update == SessionUpdate(answers=AnswerUpdate(tool_choice="none"))  # (echoed, as it was set)
    # What an agent SDK sends with its set-up: tools (never called), tracing (none kept).
    update = parse_client_event(
        '{"type": "session.update", "session": {"instructions": "Hi", "tracing": "auto", "parallel_tool_calls": false, '
        '"tools": [{"type": "function", "name": "f", "parameters": {}}], "tool_choice": "auto"}}'
    )
    assert update == SessionUpdate(answers=AnswerUpdate(instructions="Hi", tool_choice="auto"))
    for session, speed in (('{"speed": 0.25}', 0.25), ('{"audio": {"output": {"speed": 1.5}}}', 1.5)):
        update = parse_client_event('{"type": "session.update", "session": ' + session + "}")
        assert update == SessionUpdate(answers=AnswerUpdate(speed=speed))  # (both shapes' names)
    for session, kind in (
        ('{"input_audio_noise_reduction": {"type": "near_field"}}', "near_field"),
        ('{"audio": {"input": {"noise_reduction": {"type": "far_field"}}}}', "far_field"),
        ('{"audio": {"input": {"noise_reduction": null}}}', False),
    ):
        update = parse_client_event('{"type": "session.update", "session": ' + session + "}")
        assert update == SessionUpdate(noise_reduction=kind)
    for session, param in (
        ('{"tracing": "always"}', "session.tracing"),
        ('{"tracing": {"workflow": "w"}}', "session.tracing"),
        ('{"tracing": {"workflow_name": 5}}', "session.tracing"),
        ('{"tools": [{"name": "f"}]}', "session.tools"),  # (no type: no tool object)
        ('{"tool_choice": "required"}', "session.tool_choice"),
        ('{"speed": 1.6}', "session.speed"),  # (OpenAI's range: 0.25..1.5)
        ('{"input_audio_noise_reduction": {"type": "loud"}}', "session.input_audio_noise_reduction.type"),
        ('{"audio": {"input": {"noise_reduction": {"kind": "x"}}}}', "session.audio.input.noise_reduction.kind"),
        ('{"audio": {"output": {"speed": 0.2}}}', "session.audio.output.speed"),
        ('{"audio": {"output": {"speed": "fast"}}}', "session.audio.output.speed"),
        ('{"audio": {"output": {"voice": {"id": ""}}}}', "session.audio.output.voice"),
        ('{"voice": ""}', "session.voice"),
        ('{"temperature": 0.1}', "session.temperature"),
        ('{"reasoning": {"effort": "low"}}', "session.reasoning"),
        ('{"turn_detection": {"idle_timeout_ms": 500}}', "session.turn_detection.idle_timeout_ms"),
        (
            '{"audio": {"input": {"turn_detection": {"eagerness": "high"}}}}',
            "session.audio.input.turn_detection.eagerness",
        ),
        ('{"frobnicate": 1}', "session.frobnicate"),
    ):
        with pytest.raises(ProtocolError) as info:
            parse_client_event('{"type": "session.update", "session": ' + session + "}")
        assert info.value.param == param, (session, info.value.param)
    create = parse_client_event(
        '{"type": "response.create", "response": {"voice": "alloy", "temperature": 0.7, '
        '"max_output_tokens": 9, "instructions": "Hi", "conversation": "auto", "metadata": {}}}'
    )
    assert create == ResponseCreate(None, "Hi", "alloy", 0.7, 9, metadata={})  # (echoed in the response)
    for field, expected in (("output_modalities", '["audio"] or ["text"]'), ("modalities", '["text", "audio"]')):
        with pytest.raises(ProtocolError, match=re.escape(expected)):  # each shape's own values
            parse_client_event(json.dumps({"type": "response.create", "response": {field: []}}))
    for response, param in (
        ('{"conversation": "elsewhere"}', "response.conversation"),
        ('{"input": []}', "response.input"),  # (out-of-band responses only)
        ('{"conversation": "none", "input": {}}', "response.input"),
        ('{"conversation": "none", "input": [{"type": "item_reference"}]}', "response.input[0].id"),
        ('{"conversation": "none", "modalities": ["audio", "text"]}', "response.modalities"),  # (beta's name)
        ('{"max_response_output_tokens": 0}', "response.max_response_output_tokens"),
        ('{"audio": {"output": {"speed": 1.2}}}', "response.audio.output.speed"),  # (the session's alone)
    ):
        with pytest.raises(ProtocolError) as info:
            parse_client_event('{"type": "response.create", "response": ' + response + "}")
        assert info.value.param == param, (response, info.value.param)


def test_server_event_builders():
    sent: list[dict] = []
    sender = EventSender("sess_1", lambda: None, sent.append)
    sender.send(server_events.speech_started(320, "item_1"))
    response = response_events.response_object("r1", None, True, "alloy", None)
    sender.send(response_events.response_done(response, "cancelled", "hi", {"played_s": 0.5}, reason="turn_detected"))
    first, second = sent
    assert first == {
        "event_id": "evt_1",
        "type": "input_audio_buffer.speech_started",
        "audio_start_ms": 320,
        "item_id": "item_1",
    }
    assert second["event_id"] == "evt_2" and second["response"]["status"] == "cancelled"
    assert second["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert server_events.error("x", "msg")["error"] == {
        "type": "invalid_request_error",
        "code": "x",
        "message": "msg",
        "param": None,
        "event_id": None,
    }
    with pytest.raises(ValueError):
        response_events.response_done(response, "exploded", "", {})
    item = server_events.message_item("item_2", "assistant", "Hello", has_audio=True, index=1)
    assert item["content"] == [{"type": "output_audio", "transcript": "Hello"}] and item["index"] == 1
    assert [e["type"] for e in response_events.text_done("r1", "item_2", "Hello", spoken=True)] == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
    ]
    json.dumps(server_events.committed("c", 0, 1.23456, "item_1", None))  # every event is JSON-serialisable
