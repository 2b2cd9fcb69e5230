"""The fields client events share, each parsed and checked once: a JSON object, a typed
field, the output modalities, an output token limit, a pcm16 audio format, base64 pcm16 audio
and metadata. A wrong value is a ProtocolError naming the field (`param`), sent back as an
`error` event."""

from __future__ import annotations

from typing import Any

from kimiaudio.audio import pcm16
from kimiaudio.audio.rates import OPENAI_PCM16_RATE, SPEECH_INPUT_RATE
from kimiaudio.errors import AudioInputError, KimiAudioError
from kimiaudio.server.inputs.openai_params import checked, voice_name
from kimiaudio.server.inputs.realtime_params import RealtimeSampling
from kimiaudio.text.output_type import EXPECTED_MODALITIES, EXPECTED_OUTPUT_MODALITIES, output_type_of

INPUT_RATES = (SPEECH_INPUT_RATE, OPENAI_PCM16_RATE)  # pcm16 input rates a session takes
# OpenAI's G.711 formats, beta's names and GA's types: on a WebRTC call the media is the call's
# codec whatever the session names, so there they are taken and change nothing.
G711_FORMATS = ("g711_ulaw", "g711_alaw")
G711_TYPES = ("audio/pcmu", "audio/pcma")


class ProtocolError(KimiAudioError):
    """A client event that cannot be used; `code` is machine-readable, `param` names the field."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param
        self.event_id: str | None = None  # the client event at fault, when it named itself


def object_field(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("invalid_event", f"{where}: expected a JSON object, got {type(value).__name__}", where)
    return value


def optional_object(obj: dict, key: str, where: str) -> dict[str, Any]:
    """obj[key], a JSON object; {} when absent or null (an empty list or string is no object either)."""
    value = obj.get(key)
    return {} if value is None else object_field(value, where)


def typed_field(obj: dict, key: str, kinds: type | tuple, where: str, what: str) -> Any:
    """obj[key] if it is None or of `kinds` (a bool is no number here), else a ProtocolError."""
    value = obj.get(key)
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if value is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
        raise ProtocolError("invalid_value", f"{where}.{key}: expected {what}, got {value!r}"[:300], f"{where}.{key}")
    return value


def voice_field(obj: dict, key: str, where: str) -> str | None:
    """A voice name, given as one or as a custom voice `{"id": name}` (openai_params.voice_name)."""
    expected = 'a voice name or {"id": name}'
    name = typed_field({key: voice_name(obj.get(key))}, key, str, where, expected)
    if name == "":
        raise ProtocolError("invalid_value", f"{where}.{key}: expected {expected}, got an empty name", f"{where}.{key}")
    return name


def output_limit(obj: dict, where: str) -> int | None:
    """max_output_tokens (GA) or max_response_output_tokens (beta): a positive integer, or "inf"
    as 0 (config [sampling] max_new_tokens' "the official limit", so it lifts an earlier
    integer); None where the client left it out."""
    key = "max_output_tokens" if "max_output_tokens" in obj else "max_response_output_tokens"
    limit = obj.get(key)
    if limit is None:
        return None
    if limit == "inf":
        return 0

    def error(code: str, message: str, param: str) -> ProtocolError:
        return ProtocolError(code, message.replace("max_output_tokens", key), f"{where}.{key}")

    return checked(RealtimeSampling, {"max_output_tokens": limit}, f"{where}.", error)["max_output_tokens"]


def output_type_field(obj: dict, where: str) -> str | None:
    key = "output_modalities" if "output_modalities" in obj else "modalities"
    modalities = obj.get(key)
    if modalities is None:
        return None
    output_type = output_type_of(modalities)
    if output_type is None:
        expected = EXPECTED_OUTPUT_MODALITIES if key == "output_modalities" else EXPECTED_MODALITIES
        raise ProtocolError(
            "invalid_value",
            f"{where}.{key}: expected {expected}, got {modalities!r}"[:200],
            f"{where}.{key}",
        )
    return output_type


def pcm16_rate(fmt: Any, where: str, output: bool = False, webrtc: bool = False) -> int | None:
    """pcm16 (beta: 24 kHz) or GA {"type": "audio/pcm", "rate": 24000 | 16000 (input only)};
    on a WebRTC call (`webrtc`) G.711 too, as None (unchanged): the call's media carries the
    audio in its own codec, and the data channel's audio stays pcm16, as the session says."""
    if fmt is None or fmt == "pcm16":
        return None if fmt is None else OPENAI_PCM16_RATE
    if webrtc and (fmt in G711_FORMATS or (isinstance(fmt, dict) and fmt.get("type") in G711_TYPES)):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "audio/pcm":
        rate = fmt.get("rate", OPENAI_PCM16_RATE)
        if rate in (INPUT_RATES if not output else (OPENAI_PCM16_RATE,)):
            return rate
    raise ProtocolError(
        "unsupported_format",
        f"{where}: kimiaudio takes and sends pcm16 (24 kHz{'' if output else ' or 16 kHz'} mono), got {fmt!r}"[:300],
        where,
    )


def decode_pcm16(data: Any, where: str, whole_samples: bool = True) -> bytes:
    """Base64 audio of a client event: raw 16-bit samples (an even number of bytes, unless not
    `whole_samples`: a piece of a byte stream, input_audio_buffer.append's)."""
    if not isinstance(data, str):
        raise ProtocolError("invalid_value", f"{where}: expected base64 text", where)
    try:
        raw = pcm16.from_base64(data, where)
        return pcm16.check_samples(raw, where) if whole_samples else raw
    except AudioInputError as exc:
        raise ProtocolError("invalid_audio", str(exc), where) from None


def metadata_field(value: Any, where: str) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return None

    def fits(key: Any, item: Any) -> bool:
        return isinstance(key, str) and isinstance(item, str) and len(key) <= 64 and len(item) <= 512

    if not isinstance(value, dict) or len(value) > 16 or not all(fits(k, v) for k, v in value.items()):
        raise ProtocolError(
            "invalid_value",
            f"{where}: expected at most 16 string pairs (keys up to 64 characters, values up to 512)",
            where,
        )
    return dict(value)
