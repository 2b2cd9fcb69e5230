"""The streamed answer of POST /v1/chat/completions: chat.completion.chunk server-sent events.

As OpenAI streams them: a first chunk with the role, then for a text answer `delta.content`
pieces (with their tokens' `logprobs` when asked for); for a spoken one `delta.audio` pieces,
each holding the answer's id and either `transcript` text or `data` (base64 of the next
encoded bytes in audio.format, pcm16 being raw 24 kHz s16le), as the pipeline makes them, so
the first audio leaves before the answer is finished; the last audio piece holds `expires_at`.
Then a chunk with finish_reason, a usage chunk if stream_options.include_usage, and [DONE].
The stream opens at the turn's first event: a turn refused before it (a prompt too long) is an
HTTP error (turn_guard.once_started), one that fails after is an `error` event in the stream
(the status line is sent already). A client that goes away ends the stream: its turn is
cancelled by the guard, nothing more is written, and its log line says `cancelled=client_closed`.
"""

from __future__ import annotations

import base64

import numpy as np
from aiohttp import web

from kimiaudio.audio.encode import StreamEncoder
from kimiaudio.audio.rates import SPEECH_OUTPUT_RATE
from kimiaudio.errors import StoreUnavailableError
from kimiaudio.pipeline.events import AudioChunk, TextDelta, TurnDone
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.observe.request_log import CLIENT_CLOSED, request_record
from kimiaudio.server.token_logprobs import logprobs_object
from kimiaudio.server.v1.openai_output import open_stream, send_done, send_error, send_event
from kimiaudio.server.v1.turn_guard import client_gone, failed_turn_error, once_started
from kimiaudio.store.answer_store import new_answer_id, save_answer


async def stream_answer(request: web.Request, handle, chat, completion: dict, store, ttl_s: float):
    events = await once_started(request, handle, "generation_failed", "the answer", "messages")
    response = await open_stream(request)
    record = request_record(request)
    wants_logprobs = chat.answer.logprobs

    async def chunk(delta: dict, reason: str | None = None, logprobs=None, **extra) -> None:
        await send_event(
            response,
            {
                **completion,
                "object": "chat.completion.chunk",
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "finish_reason": reason,
                        "logprobs": logprobs_object(logprobs) if wants_logprobs and logprobs is not None else None,
                    }
                ],
                **extra,
            },
        )

    spoken = chat.answer.output_type == "both"
    answer_id = new_answer_id()
    encoder = StreamEncoder(chat.answer.audio_format, SPEECH_OUTPUT_RATE) if spoken else None
    pcm: list[np.ndarray] = []
    done: TurnDone | None = None
    try:
        await chunk({"role": "assistant", "content": None if spoken else ""})
        async for event in events:
            if client_gone(request):
                record.cancelled = CLIENT_CLOSED
                return response  # the guard cancels the turn
            if isinstance(event, (TextDelta, AudioChunk)):
                record.first_byte()
            if isinstance(event, TextDelta) and event.text:
                await chunk(
                    {"audio": {"id": answer_id, "transcript": event.text}} if spoken else {"content": event.text},
                    logprobs=event.logprobs,
                )
            elif isinstance(event, AudioChunk) and encoder is not None:
                pcm.append(np.asarray(event.pcm, dtype=np.float32).reshape(-1))
                note_audio_out(request, pcm[-1])
                await _audio_data(chunk, answer_id, encoder.push(pcm[-1]))
            elif isinstance(event, TurnDone):
                done = event
        if done is None or done.status != "completed":
            error = failed_turn_error(request, done, "generation_failed", "the answer", "messages")
            await send_error(request, response, error)
            await send_done(response)
            return response
        if encoder is not None:
            await _audio_data(chunk, answer_id, encoder.finish())
            audio = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
            try:
                answer = await save_answer(store, answer_id, done.text, done.audio_tokens, audio, ttl_s)
            except StoreUnavailableError as exc:  # the status line is sent: said in the stream
                await send_error(
                    request,
                    response,
                    ApiError(503, "database_unavailable", f"the answer's audio id could not be kept ({exc})"),
                )
                await send_done(response)
                return response
            await chunk({"audio": {"id": answer_id, "expires_at": int(answer.expires_at)}})
        await chunk({}, finish_reason(done))
        if chat.streaming.include_usage:
            await send_event(
                response, {**completion, "object": "chat.completion.chunk", "choices": [], "usage": usage(done)}
            )
        await send_done(response)
    except ConnectionResetError:  # the client went away between two writes
        record.cancelled = CLIENT_CLOSED
    return response


def note_audio_out(request: web.Request, pcm: np.ndarray) -> None:
    """Answer audio (24 kHz) going to the client: on the request's log line, and in the server's
    kimiaudio_audio_generated_seconds as the sessions' audio is (session/playback.py)."""
    seconds = pcm.size / SPEECH_OUTPUT_RATE
    request_record(request).add_audio_out(seconds)
    server_context(request).metrics.note_audio(seconds)


async def _audio_data(chunk, answer_id: str, data: bytes) -> None:
    if data:
        await chunk({"audio": {"id": answer_id, "data": base64.b64encode(data).decode("ascii")}})


def finish_reason(done: TurnDone) -> str:
    return "length" if done.finish_reason == "length" else "stop"


def usage(done: TurnDone) -> dict:
    """Prompt positions (computed + served from the prefix cache) and generated positions, with
    OpenAI's details: the prompt's speech-code positions, the answer's speech codes and text
    tokens (the model speaks and writes at the same positions, so these two may add up to more
    than the positions), and no reasoning or predicted-output tokens, the model having none."""
    prompt = done.prefill_tokens_computed + done.prefill_tokens_cached
    completion = len(done.text_tokens)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": done.prefill_tokens_cached,
            "audio_tokens": done.prompt_audio_tokens,
        },
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": len(done.audio_tokens),
            "text_tokens": done.generated_text_tokens,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
