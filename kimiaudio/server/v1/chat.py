"""POST /v1/chat/completions: audio or text in; text, or speech and its transcript, out.

The request becomes one pipeline turn (chat_body.py), run in the shared pipeline and
cancelled at once if the client goes away (turn_guard.py). Without `stream` the answer is
one chat.completion: `message.content` (text answers) or `message.audio` {id, data (the
whole answer encoded in audio.format, base64), transcript, expires_at}. A spoken answer is
kept in the answer store under its id until expires_at (server.audio_answer_ttl_s), so a
later request can name it as history. `stream: true` answers with server-sent
chat.completion.chunk events as the answer is generated (chat_stream.py).
Bodies may hold up to server.max_body_bytes (34 MB by default: 25 MB of audio, base64-encoded).
"""

from __future__ import annotations

import base64
import secrets
import time
from typing import Any

import numpy as np
from aiohttp import web

from kimiaudio.audio.encode import encode_audio
from kimiaudio.audio.rates import SPEECH_INPUT_RATE, SPEECH_OUTPUT_RATE
from kimiaudio.pipeline.events import AudioChunk, TurnDone
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.pipeline.voice_registry import UnknownVoiceError, Voice
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.context import server_context
from kimiaudio.server.inputs.json_input import read_json_body
from kimiaudio.server.inputs.openai_params import MODEL_ID
from kimiaudio.server.observe.request_log import request_record
from kimiaudio.server.token_logprobs import logprobs_object
from kimiaudio.server.v1.chat_body import ChatRequest, parse_chat_body
from kimiaudio.server.v1.chat_stream import finish_reason, note_audio_out, stream_answer, usage
from kimiaudio.server.v1.turn_guard import failed_turn_error, guarded_turn
from kimiaudio.store import ConversationStore
from kimiaudio.store.answer_store import new_answer_id, save_answer


async def chat_completions(request: web.Request) -> web.StreamResponse:
    context = server_context(request)
    config, pipeline, store = context.config, context.pipeline, context.store
    # bad JSON: 400, too large: 413 (the error middleware says so)
    body = await read_json_body(request, config.server.max_body_bytes)
    chat = await parse_chat_body(body, config, store, pipeline.can_speak, pipeline.speech_positions_per_second)
    turn = TurnRequest(
        conversation_id="chat",
        history=chat.history,
        user_audio=chat.user_audio,
        user_text=chat.user_text,
        sampling=chat.sampling,
        output_type=chat.answer.output_type,
        voice=await _voice(pipeline, chat),
        stop=chat.stop,
        logprobs=chat.answer.logprobs,
    )
    record = request_record(request)
    if chat.user_audio is not None:  # a written turn brings no audio
        record.audio_in_s = chat.user_audio.size / SPEECH_INPUT_RATE
    completion = {"id": f"chatcmpl-{secrets.token_hex(12)}", "created": int(time.time()), "model": MODEL_ID}
    async with guarded_turn(request, pipeline, turn) as handle:
        if chat.streaming.on:
            return await stream_answer(request, handle, chat, completion, store, config.server.audio_answer_ttl_s)
        pcm, done = await _collect(handle)
    note_audio_out(request, pcm)
    if done is None or done.status != "completed":
        raise failed_turn_error(request, done, "generation_failed", "the answer", "messages")
    message: dict[str, Any] = {"role": "assistant", "content": done.text, "refusal": None}
    if chat.answer.output_type == "both":
        message["content"] = None  # as OpenAI: a spoken answer's text is its transcript
        message["audio"] = await _audio(chat, done, pcm, store, config.server.audio_answer_ttl_s)
    return web.json_response(
        {
            **completion,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason(done),
                    "logprobs": logprobs_object(done.logprobs) if chat.answer.logprobs else None,
                }
            ],
            "usage": usage(done),
        }
    )


async def _voice(pipeline: Pipeline, chat: ChatRequest) -> Voice | None:
    """The stored voice `audio.voice` names (stock names and none: the model's own)."""
    if chat.answer.output_type != "both":
        return None
    await pipeline.voices.fetch(chat.answer.voice)
    try:
        return pipeline.voices.resolve(chat.answer.voice)
    except UnknownVoiceError as exc:
        raise ApiError(400, "invalid_value", str(exc), param="audio.voice") from None


async def _collect(handle: TurnHandle) -> tuple[np.ndarray, TurnDone | None]:
    chunks: list[np.ndarray] = []
    done = None
    async for event in handle:
        if isinstance(event, AudioChunk):
            chunks.append(np.asarray(event.pcm, dtype=np.float32).reshape(-1))
        elif isinstance(event, TurnDone):
            done = event
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), done


async def _audio(chat: ChatRequest, done: TurnDone, pcm: np.ndarray, store: ConversationStore, ttl_s: float) -> dict:
    answer = await save_answer(store, new_answer_id(), done.text, done.audio_tokens, pcm, ttl_s)
    data = encode_audio(pcm, chat.answer.audio_format, SPEECH_OUTPUT_RATE)
    return {
        "id": answer.id,
        "data": base64.b64encode(data).decode("ascii"),
        "transcript": done.text,
        "expires_at": int(answer.expires_at),
    }
