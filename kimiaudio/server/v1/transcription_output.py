"""What a transcription answers, in each `response_format` and in its stream's last event.

json: the text (with `logprobs` when asked for) and the audio's duration as usage; text: the
text alone; srt/vtt: one cue spanning the audio (the model gives no word timestamps), none for
no text; verbose_json: one segment spanning the audio, every number in it measured (the SDK's
TranscriptionVerbose requires each field: a value that cannot be measured gets its neutral
one), no segment for audio with nothing said. A stream's `transcript.text.done` carries the
usage in tokens, the only usage its event has.
"""

from __future__ import annotations

import math
import zlib

from aiohttp import web

from kimiaudio.pipeline.events import TurnDone
from kimiaudio.server.token_logprobs import token_logprobs
from kimiaudio.text.asr_instruction import WHISPER_LANGUAGES

UNDETERMINED_LANGUAGE = "undetermined"  # verbose_json's language when the request named none


def formatted(text: str, response_format: str, seconds: float, logprobs) -> web.Response:
    """The answer in json, text, srt or vtt; `logprobs` (json): the text tokens', or None."""
    if response_format == "json":
        extra = {"logprobs": token_logprobs(logprobs)} if logprobs is not None else {}
        return web.json_response({"text": text, **extra, "usage": _duration(seconds)})
    if response_format == "text":
        return web.Response(text=text, content_type="text/plain")
    if response_format == "srt":
        cue = f"1\n{_timestamp(0, ',')} --> {_timestamp(seconds, ',')}\n{text}\n\n" if text else ""
        return web.Response(text=cue, content_type="application/x-subrip")
    cue = f"{_timestamp(0, '.')} --> {_timestamp(seconds, '.')}\n{text}\n\n" if text else ""
    return web.Response(text=f"WEBVTT\n\n{cue}", content_type="text/vtt")


def verbose(text: str, seconds: float, language: str | None, segments: list[dict]) -> dict:
    return {
        "task": "transcribe",
        # As OpenAI reports it ("english"). The model names no language it heard: without one
        # asked for, ISO 639's code for a language not identified ("und"), by its name.
        "language": WHISPER_LANGUAGES[language] if language is not None else UNDETERMINED_LANGUAGE,
        "duration": round(seconds, 3),
        "text": text,
        "segments": segments,
        "usage": _duration(seconds),
    }


def segment(text: str, done: TurnDone, seconds: float, temperature: float, speech_probability: float) -> dict:
    """verbose_json's one segment over the audio."""
    return {
        "id": 0,
        "seek": 0,
        "start": 0.0,
        "end": round(seconds, 3),
        "text": text,
        "tokens": [e.token_id for e in done.logprobs],
        "temperature": temperature,
        "compression_ratio": compression_ratio(text),
        "no_speech_prob": round(1.0 - speech_probability, 6),
        # The mean over the sampled text tokens. With none (the text ended at once: the end
        # token's own log-probability is not kept), 0.0, the log of the empty product: no token
        # doubted, never under OpenAI's -1 that marks a failed decoding.
        "avg_logprob": sum(e.logprob for e in done.logprobs) / len(done.logprobs) if done.logprobs else 0.0,
    }


def stream_usage(done: TurnDone | None) -> dict:
    """`transcript.text.done`'s usage: the prompt's positions (the instruction and the audio's
    tokens, counted apart in input_token_details) and the text tokens generated; none for a turn
    that did not run."""
    prompt = done.prefill_tokens_computed + done.prefill_tokens_cached if done is not None else 0
    output = len(done.text_tokens) if done is not None else 0
    details = {
        "text_tokens": done.prompt_text_tokens if done is not None else 0,
        "audio_tokens": done.prompt_audio_tokens if done is not None else 0,
    }
    return {
        "type": "tokens",
        "input_tokens": prompt,
        "input_token_details": details,
        "output_tokens": output,
        "total_tokens": prompt + output,
    }


def compression_ratio(text: str) -> float:
    """Whisper's: UTF-8 bytes over their zlib-compressed bytes (repetitive text compresses well)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


def _duration(seconds: float) -> dict:
    return {"type": "duration", "seconds": math.ceil(seconds)}


def _timestamp(seconds: float, separator: str) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{separator}{ms % 1000:03d}"
