"""The data-channel protocol (kimiaudio/server/events.py): builders and client validation."""

import json

import pytest

from kimiaudio.server import events
from kimiaudio.server.events import ConversationSelect, ProtocolError, ResponseCancel, SessionUpdate, parse_client_event


def test_client_events_parse():
    assert parse_client_event('{"type": "response.cancel"}') == ResponseCancel()
    assert parse_client_event(b'{"type": "conversation.select", "conversation_id": null}') == ConversationSelect(None)
    assert parse_client_event('{"type": "conversation.select", "conversation_id": "abc"}') == ConversationSelect("abc")
    update = parse_client_event(json.dumps({"type": "session.update", "event_id": "e1", "session": {
        "vad": {"threshold": 0.6}, "sampling": {"audio_temperature": 0.5}, "output_type": "text"}}))
    assert update == SessionUpdate({"threshold": 0.6}, {"audio_temperature": 0.5}, "text")


@pytest.mark.parametrize("message, code, words", [
    ("{not json", "invalid_json", "not valid JSON"),
    (b"\xff\xfe", "invalid_json", "UTF-8"),
    ("[1]", "invalid_event", "JSON object"),
    ('{"type": "response.create"}', "unknown_event", "response.cancel"),
    ('{"kind": "x"}', "unknown_event", "None"),
    ('{"type": "response.cancel", "extra": 1}', "invalid_event", "extra"),
    ('{"type": "conversation.select", "conversation_id": 5}', "invalid_event", "conversation_id"),
    ('{"type": "session.update", "session": {"vad": "fast"}}', "invalid_event", "session.vad"),
    ('{"type": "session.update", "session": {"voice": "x"}}', "invalid_event", "voice"),
    ('{"type": "session.update", "session": {"output_type": "audio"}}', "invalid_event", "output_type"),
    ("x" * 70000, "invalid_event", "too large"),
])
def test_bad_client_events_have_clear_errors(message, code, words):
    with pytest.raises(ProtocolError) as info:
        parse_client_event(message)
    assert info.value.code == code and words in str(info.value)


def test_server_event_builders():
    ids = events.EventIds()
    first = ids.stamp(events.speech_started(320))
    second = ids.stamp(events.response_done("r1", "cancelled", "hi", {"played_s": 0.5}))
    assert first == {"event_id": "evt_1", "type": "input_audio_buffer.speech_started", "audio_start_ms": 320}
    assert second["event_id"] == "evt_2" and second["response"]["status"] == "cancelled"
    assert events.error("x", "msg") == {"type": "error", "error": {"code": "x", "message": "msg"}}
    with pytest.raises(ValueError):
        events.response_done("r1", "exploded", "", {})
    json.dumps(events.committed("c", 0, 1.23456))  # every event is JSON-serialisable
