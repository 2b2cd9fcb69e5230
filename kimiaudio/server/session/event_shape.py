"""How one connection's events are named and shaped: the OpenAI Realtime API's GA shape
(`client.realtime.connect()`, OpenAI's WebRTC calls) or its beta shape
(`client.beta.realtime.connect()`, chosen by the client at the upgrade: session.created comes
first), over WebRTC or not.

This is the one place where the shapes differ. The session builds every event in the GA shape
(server_events.py, response_events.py); its EventSender hands each to its shape (`event`),
which returns it as the connection speaks it, or None when that connection has no such event;
the session object comes from the shape as well (`session`, session_objects.py).

- GA: the events as built. `output_audio_buffer.*` only over WebRTC, where the server plays the
  answer itself (on a WebSocket the client buffers and plays the audio deltas it gets).
- beta: `response.output_text.*` -> `response.text.*`, `response.output_audio.*` ->
  `response.audio.*`, `response.output_audio_transcript.*` -> `response.audio_transcript.*`,
  `conversation.item.added` -> `conversation.item.created`, no `conversation.item.done` nor
  `input_audio_buffer.timeout_triggered` (its commit and response come all the same); an
  assistant item's content `output_audio` / `output_text` -> `audio` / `text`; a response's
  `output_modalities` -> `modalities`, its `audio.output` -> `voice` and `output_audio_format`;
  a transcription session's update is `transcription_session.updated`.
"""

from __future__ import annotations

from typing import Any

from kimiaudio.server.session.session_objects import beta_session, ga_session
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.text.output_type import modalities_of, output_type_of

APIS = ("ga", "beta")


class EventShape:
    """The GA shape; `webrtc`: the connection's audio is played by the server (media track)."""

    api = "ga"

    def __init__(self, webrtc: bool = False):
        self.webrtc = webrtc

    def event(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """`event` (GA, as built) as this connection speaks it; None: it has no such event."""
        if event["type"].startswith("output_audio_buffer.") and not self.webrtc:
            return None
        return event

    def session(self, settings: SessionSettings, session_id: str, conversation_id: str | None) -> dict[str, Any]:
        """The session object of session.created / .updated."""
        return ga_session(settings, session_id, conversation_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(webrtc={self.webrtc})"


BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
}
GA_ONLY = ("conversation.item.done", "input_audio_buffer.timeout_triggered")
BETA_CONTENT = {"output_audio": "audio", "output_text": "text"}


class BetaShape(EventShape):
    api = "beta"

    def event(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event["type"]
        if super().event(event) is None or kind in GA_ONLY:
            return None
        event = {**event, "type": BETA_NAMES.get(kind, kind)}
        if "item" in event:
            event["item"] = _beta_item(event["item"])
        if "response" in event:
            event["response"] = _beta_response(event["response"])
        if kind == "session.updated" and event["session"].get("object") == "realtime.transcription_session":
            event["type"] = "transcription_session.updated"
        return event

    def session(self, settings: SessionSettings, session_id: str, conversation_id: str | None) -> dict[str, Any]:
        return beta_session(settings, session_id, conversation_id)


def _beta_item(item: dict[str, Any]) -> dict[str, Any]:
    content = [{**part, "type": BETA_CONTENT.get(part["type"], part["type"])} for part in item["content"]]
    return {**item, "content": content}


def _beta_response(response: dict[str, Any]) -> dict[str, Any]:
    response = dict(response)
    if "output_modalities" in response:
        output_type = output_type_of(response.pop("output_modalities"))
        response["modalities"] = modalities_of(output_type) if output_type is not None else ["text"]
    audio = response.pop("audio", None)
    if audio is not None:
        response["voice"] = audio["output"]["voice"]
        response["output_audio_format"] = "pcm16"
    if "output" in response:
        response["output"] = [_beta_item(item) for item in response["output"]]
    return response


def event_shape(api: str = "ga", webrtc: bool = False) -> EventShape:
    """The shape named `api` ("ga" or "beta")."""
    if api not in APIS:
        raise ValueError(f"event shape must be one of {APIS}, got {api!r}")
    return BetaShape(webrtc) if api == "beta" else EventShape(webrtc)
