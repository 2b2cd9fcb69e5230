"""Server -> client events of one response, in the OpenAI Realtime API's GA names and shapes
(a beta connection's EventShape renames them: event_shape.py).

A response's events, in order (the Responder sends them: responder.py):
response.created, response.output_item.added, conversation.item.added (the assistant item,
server_events.py), response.content_part.added, output_audio_buffer.started (when its first
audio plays; WebRTC only), response.output_audio_transcript.delta + response.output_audio.delta
(WebSocket; on WebRTC the audio is on the media track) or response.output_text.delta,
response.output_audio.done + response.output_audio_transcript.done or
response.output_text.done, response.content_part.done, response.output_item.done,
conversation.item.done, response.done, then output_audio_buffer.stopped (its audio played out)
or, when it was cut short while playing, output_audio_buffer.cleared at the cut.

One assistant message with one content part: output_index and content_index are always 0.
kimiaudio adds to response.done's response its `text`, `timings` (seconds) and the prompt's
cached and computed positions.
"""

from __future__ import annotations

from typing import Any

from kimiaudio.audio.rates import OPENAI_PCM16_RATE
from kimiaudio.server import api_error
from kimiaudio.server.session import server_events

RESPONSE_STATUSES = ("completed", "incomplete", "cancelled", "failed")
CANCEL_REASONS = ("turn_detected", "client_cancelled")  # OpenAI's reasons for a cancelled response
INCOMPLETE_REASON = "max_output_tokens"  # an answer cut by its length limit (OpenAI's reason)


def response_object(
    response_id: str,
    conversation_id: str | None,
    spoken: bool,
    voice: str | None,
    max_output_tokens: int | None,
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    """OpenAI's response object as a response starts (in progress, no output yet); `metadata`:
    the response.create's, echoed as OpenAI echoes it."""
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": "in_progress",
        "output": [],
        "conversation_id": conversation_id,
        "output_modalities": ["audio"] if spoken else ["text"],
        "max_output_tokens": max_output_tokens or "inf",
        "audio": {"output": {"format": {"type": "audio/pcm", "rate": OPENAI_PCM16_RATE}, "voice": voice}},
        "metadata": metadata,
    }


def response_created(response: dict[str, Any]) -> dict:
    return {"type": "response.created", "response": response}


def output_item_added(response_id: str, item: dict[str, Any]) -> dict:
    return {"type": "response.output_item.added", "response_id": response_id, "output_index": 0, "item": item}


def output_item_done(response_id: str, item: dict[str, Any]) -> dict:
    return {"type": "response.output_item.done", "response_id": response_id, "output_index": 0, "item": item}


def _part(kind: str, response_id: str, item_id: str, **fields: Any) -> dict:
    return {
        "type": kind,
        "response_id": response_id,
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
        **fields,
    }


def _content(spoken: bool, text: str) -> dict:
    return {"type": "audio", "transcript": text} if spoken else {"type": "text", "text": text}


def content_part_added(response_id: str, item_id: str, spoken: bool) -> dict:
    return _part("response.content_part.added", response_id, item_id, part=_content(spoken, ""))


def content_part_done(response_id: str, item_id: str, spoken: bool, text: str) -> dict:
    return _part("response.content_part.done", response_id, item_id, part=_content(spoken, text))


def text_delta(response_id: str, item_id: str, delta: str) -> dict:
    """Text of a text-only answer."""
    return _part("response.output_text.delta", response_id, item_id, delta=delta)


def transcript_delta(response_id: str, item_id: str, delta: str) -> dict:
    """Text of a spoken answer (its transcript, generated beside the speech)."""
    return _part("response.output_audio_transcript.delta", response_id, item_id, delta=delta)


def audio_delta(response_id: str, item_id: str, audio_base64: str) -> dict:
    return _part("response.output_audio.delta", response_id, item_id, delta=audio_base64)


def text_done(response_id: str, item_id: str, text: str, spoken: bool) -> list[dict]:
    """The end of a response's content: output_text.done, or output_audio.done +
    output_audio_transcript.done."""
    if not spoken:
        return [_part("response.output_text.done", response_id, item_id, text=text)]
    return [
        _part("response.output_audio.done", response_id, item_id),
        _part("response.output_audio_transcript.done", response_id, item_id, transcript=text),
    ]


def audio_buffer(event: str, response_id: str) -> dict:
    """output_audio_buffer.started / .stopped / .cleared: the server's playback of a response
    (WebRTC: what the client hears)."""
    if event not in ("started", "stopped", "cleared"):
        raise ValueError(f"output_audio_buffer events are started, stopped or cleared, got {event!r}")
    return {"type": f"output_audio_buffer.{event}", "response_id": response_id}


def response_done(
    response: dict[str, Any],
    status: str,
    text: str,
    timings: dict[str, float],
    error: str | None = None,
    output: list[dict] | None = None,
    reason: str | None = None,
    error_code: str | None = None,
    **extra: Any,
) -> dict:
    """`response`: its response_object. A cancelled response says why (`reason`, one of
    CANCEL_REASONS), an incomplete one INCOMPLETE_REASON; a failed one, its error (`error_code`:
    a failure that was the request's fault, TurnDone.error_code, named as OpenAI does)."""
    if status not in RESPONSE_STATUSES:
        raise ValueError(f"response status must be one of {RESPONSE_STATUSES}, got {status!r}")
    done = {**response, "status": status, "output": output or [], "text": text, "timings": timings, **extra}
    if status != "completed":
        details: dict[str, Any] = {"type": status}
        if status == "cancelled" and reason in CANCEL_REASONS:  # (none: not the client's doing)
            details["reason"] = reason
        elif status == "incomplete":
            details["reason"] = INCOMPLETE_REASON
        if error:
            details["error"] = {"message": error, **_client_fault(error_code)}
        done["status_details"] = details
    if error:
        done["error"] = error
    return {"type": "response.done", "response": done}


def _client_fault(code: str | None) -> dict:
    """The error's type and code: the request's fault when named, but for the server's own."""
    if code is None:
        return {"type": api_error.SERVER_ERROR}
    return {
        "type": api_error.SERVER_ERROR if code in server_events.SERVER_FAULTS else api_error.INVALID_REQUEST,
        "code": code,
    }


def response_usage(done) -> dict:
    """OpenAI's response usage of a TurnDone: prompt positions in, generated positions out, with
    the prompt's speech-code and text positions and the answer's speech codes and text tokens
    (the model speaks and writes at the same positions: the two may add up to more or less than
    the positions)."""
    prompt = done.prefill_tokens_computed + done.prefill_tokens_cached
    return {
        "total_tokens": prompt + len(done.text_tokens),
        "input_tokens": prompt,
        "output_tokens": len(done.text_tokens),
        "input_token_details": {
            "cached_tokens": done.prefill_tokens_cached,
            "text_tokens": done.prompt_text_tokens,
            "audio_tokens": done.prompt_audio_tokens,
        },
        "output_token_details": {"text_tokens": done.generated_text_tokens, "audio_tokens": len(done.audio_tokens)},
    }
