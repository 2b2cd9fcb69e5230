"""OpenAI's turn_detection object (beta `session.turn_detection`, GA
`session.audio.input.turn_detection`) read onto config [vad] keys, each checked as the
configuration checks it but named as the client named it, with what is not a [vad] key: the
mode, whether a commit of the VAD starts a response, the idle timeout, and semantic_vad's
eagerness.

semantic_vad is served by the same silero VAD, which hears silence, not meaning: its eagerness
is the silence that ends a turn, as a part of the server's [vad] silence_ms (EAGERNESS_SILENCE:
"low" waits three times as long for the user to go on, "high" half as long; "auto" is OpenAI's
"medium"). A silence_duration_ms the client names beside it wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimiaudio.config import MILLISECONDS, check_setting
from kimiaudio.errors import ConfigError
from kimiaudio.server.inputs.openai_params import checked
from kimiaudio.server.inputs.realtime_params import TURN_DETECTION_FIELDS, RealtimeTurnDetection
from kimiaudio.server.session.event_fields import ProtocolError, object_field, typed_field

# turn_detection's fields onto config [vad] keys: (ours, OpenAI's, their JSON types).
TURN_DETECTION_VAD = (
    ("threshold", "threshold", (int, float)),
    ("silence_ms", "silence_duration_ms", int),
    ("prefix_padding_ms", "prefix_padding_ms", int),
    ("barge_in", "interrupt_response", bool),
)
MAX_SILENCE_MS = int(MILLISECONDS.max or 0)  # [vad] silence_ms's range
EAGERNESS_SILENCE = {"low": 3.0, "medium": 1.0, "auto": 1.0, "high": 0.5}


def eager_silence_ms(server_silence_ms: int, eagerness: str) -> int:
    """The silence that ends a turn at `eagerness`, from the server's [vad] silence_ms."""
    return min(round(server_silence_ms * EAGERNESS_SILENCE[eagerness]), MAX_SILENCE_MS)


@dataclass(frozen=True)
class Detection:
    kind: str  # "server_vad" | "semantic_vad" | "none"
    create_response: bool | None = None
    idle_timeout_ms: int | None = None
    eagerness: str | None = None  # semantic_vad's (EAGERNESS_SILENCE)


def parse_turn_detection(value: Any, vad: dict, where: str) -> Detection:
    """OpenAI's turn_detection onto config [vad] keys (filled into `vad`), and what is not one."""
    if value is None:
        return Detection("none")
    value = object_field(value, where)
    TURN_DETECTION_FIELDS.check(value, f"{where}.", ProtocolError)
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad", "none"):  # semantic_vad: served by the same silero VAD
        expected = 'expected "server_vad" or "semantic_vad" (turn_detection null turns it off)'
        raise ProtocolError("invalid_value", f"{where}.type: {expected}, got {kind!r}"[:200], f"{where}.type")
    for ours, theirs, kinds in TURN_DETECTION_VAD:
        if typed_field(value, theirs, kinds, where, "a " + ("boolean" if kinds is bool else "number")) is not None:
            try:  # checked here, so the error names the client's field, not the config key it sets
                vad[ours] = check_setting("vad", ours, value[theirs])
            except ConfigError as exc:
                message = str(exc).replace(f"vad.{ours}", f"{where}.{theirs}", 1)
                raise ProtocolError("invalid_value", message, f"{where}.{theirs}") from None
    create = typed_field(value, "create_response", bool, where, "true or false")
    idle = checked(RealtimeTurnDetection, value, f"{where}.", ProtocolError).get("idle_timeout_ms")
    if idle is not None and kind != "server_vad":  # (OpenAI serves it with server_vad only)
        raise ProtocolError(
            "invalid_value", f"{where}.idle_timeout_ms: only server_vad has an idle timeout", f"{where}.idle_timeout_ms"
        )
    eagerness = typed_field(value, "eagerness", str, where, "a string")
    if eagerness is not None and eagerness not in EAGERNESS_SILENCE:
        expected = f"expected one of {', '.join(EAGERNESS_SILENCE)}, got {eagerness!r}"
        raise ProtocolError("invalid_value", f"{where}.eagerness: {expected}"[:200], f"{where}.eagerness")
    if kind == "semantic_vad":
        eagerness = eagerness or "auto"
    elif eagerness not in (None, "auto"):
        raise ProtocolError("invalid_value", f"{where}.eagerness: only semantic_vad has one", f"{where}.eagerness")
    else:
        eagerness = None
    # (create_response: OpenAI's default, as for the fields above)
    return Detection(kind, True if create is None else create, idle, eagerness)
