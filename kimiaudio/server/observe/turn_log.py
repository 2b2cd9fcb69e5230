"""One structured log line per answer: that it was made and sent, how long it took, how big.

`log_response(session_id, conversation_id, event)` takes the response.done event a session
sent and writes one INFO line, `key=value` pairs in a fixed order, to the `kimiaudio.turns`
logger (so it can be routed or silenced on its own):

    turn session=sess_.. conversation=Q2.. response=resp_.. status=completed commit_to_first_audio_s=0.41
         first_pcm_s=0.32 done_s=1.9 played_s=.. prefill_tokens_cached=.. prefill_tokens_computed=.. text_chars=12

A session's EventSender (session/event_sender.py) calls it for each response.done it sends,
whatever the transport.
"""

from __future__ import annotations

import logging

from kimiaudio.server.observe.log_values import key_values

log = logging.getLogger("kimiaudio.turns")

# Timings (seconds) in a turn's path, then sizes; absent ones are left out.
_TIMINGS = (
    "queued_s",
    "encoded_s",
    "prefill_done_s",
    "first_audio_token_s",
    "first_pcm_s",
    "commit_to_first_audio_s",
    "done_s",
    "played_s",
)
_SIZES = ("prefill_tokens_cached", "prefill_tokens_computed", "output_text_tokens", "output_audio_tokens")


def turn_fields(session_id: str, conversation_id: str | None, response: dict) -> dict:
    fields = {
        "session": session_id,
        "conversation": conversation_id,
        "response": response.get("id"),
        "status": response.get("status"),
    }
    timings = response.get("timings") or {}
    fields.update({key: timings[key] for key in _TIMINGS if key in timings})
    fields.update({key: response[key] for key in _SIZES if key in response})
    fields["text_chars"] = len(response.get("text") or "")
    if response.get("error"):
        fields["error"] = response["error"]
    return fields


def log_response(session_id: str, conversation_id: str | None, event: dict) -> None:
    log.info("turn %s", key_values(turn_fields(session_id, conversation_id, event["response"])))
