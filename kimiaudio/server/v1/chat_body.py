"""A POST /v1/chat/completions body turned into one pipeline turn (validated, OpenAI's shapes).

The last message is the user's turn to answer: spoken, with an `input_audio` part (base64,
format wav/mp3/... or pcm16; its text parts come just before the audio), or written, text alone
(a string or text parts, answered as the official prompt answers a user text message).
Everything earlier becomes history: system/developer messages and user text as user text
turns, user audio as spoken user turns, assistant text as text answers, and an assistant
`audio: {"id": ...}` naming an answer this server produced (its transcript and speech codes,
from the answer store) as a spoken answer. `modalities` ["text"] (the default) or
["text", "audio"] with `audio: {"voice", "format"}`; `max_tokens` / `max_completion_tokens`,
`temperature`, `top_p`, `presence_penalty` and `frequency_penalty` (of the text stream), `seed`
and `top_logprobs` map onto the sampling settings, each checked against OpenAI's range
(inputs/openai_params.py) and its [sampling] one (chat_sampling.py; the configuration itself
is not touched); `stop` (a string or up to 4) ends the answer where one begins; `logprobs` asks
for the text tokens' log-probabilities. Fields the model cannot honour are refused (openai_params.py).
The audio parts are limited as they are decoded, each message's together to
audio.max_input_seconds and the whole request's to what engine.max_model_len holds
(inputs/audio_allowance.py): the first part past a limit is refused by its path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kimiaudio.audio.encode import FORMATS
from kimiaudio.config import Config
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.pipeline.turn_request import HistoryTurn
from kimiaudio.server.api_error import ApiError
from kimiaudio.server.inputs.audio_allowance import AudioAllowance, message_allowance, request_allowance
from kimiaudio.server.inputs.audio_input import check_input_format, decode_base64, decoded_speech
from kimiaudio.server.inputs.openai_params import (
    CHAT_FIELDS,
    ChatOutput,
    ChatSampling,
    Fields,
    check_model,
    checked,
    voice_name,
)
from kimiaudio.server.session.event_fields import ProtocolError, typed_field
from kimiaudio.server.v1.chat_sampling import chat_sampling
from kimiaudio.store.answer_store import load_answer
from kimiaudio.text.output_type import BOTH, EXPECTED_MODALITIES, TEXT, output_type_of

# The objects inside a chat body, checked as CHAT_FIELDS checks the body (openai_params.py).
AUDIO_FIELDS = Fields(honoured=frozenset({"voice", "format"}))
STREAM_OPTIONS_FIELDS = Fields(  # with `stream` only, as OpenAI has it
    honoured=frozenset({"include_usage"}),
    neutral={"include_obfuscation": (lambda v: v is False, "false (nothing is padded)")},
)


@dataclass
class ChatAnswerForm:
    """How the answer is given: text or speech (text/output_type.py), the spoken answer's
    audio format ("" for a text answer) and voice, and whether the text's log-probabilities
    come with it."""

    output_type: str
    audio_format: str
    voice: str | None
    logprobs: bool = False


@dataclass
class ChatStreaming:
    """`stream`: the answer as server-sent chunks; `stream_options.include_usage`: a last chunk
    with the token counts."""

    on: bool
    include_usage: bool


@dataclass
class ChatRequest:
    history: list[HistoryTurn]
    user_turn: HistoryTurn  # the turn to answer: the user's audio (SPEECH_INPUT_RATE), or else text
    answer: ChatAnswerForm
    streaming: ChatStreaming
    sampling: SamplingParams
    stop: tuple[str, ...] = ()

    @property
    def user_audio(self) -> np.ndarray | None:
        return self.user_turn.audio

    @property
    def user_text(self) -> str | None:
        return self.user_turn.text if self.user_turn.audio is None else None


def _bad(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, code, message, param=param)


def _option(body: dict, key: str, kinds, what: str):
    try:
        return typed_field(body, key, kinds, "", what)
    except ProtocolError:
        raise _bad(f"{key}: expected {what}", key) from None


async def parse_chat_body(
    body, config: Config, store, can_speak: bool, speech_positions_per_second: float
) -> ChatRequest:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_json")
    check_model(body.get("model"), config.server.model_aliases)
    CHAT_FIELDS.check(body)
    openai_sampling = checked(ChatSampling, body) | checked(ChatOutput, body)
    modalities = _option(body, "modalities", list, EXPECTED_MODALITIES)
    output_type = output_type_of(modalities) if modalities else TEXT
    if output_type is None:
        raise _bad(f"modalities: expected {EXPECTED_MODALITIES}", "modalities")
    audio = _option(body, "audio", dict, 'an object {"voice", "format"}') or {}
    AUDIO_FIELDS.check(audio, "audio.")
    audio_format, voice = "", None
    if output_type == BOTH:
        if not can_speak:
            raise _bad("modalities: this server answers in text only (model.text_only = true)", "modalities")
        if body.get("audio") is None:  # OpenAI's: a spoken answer names its voice and format
            needed = 'audio: required when modalities has "audio" ({"voice", "format"})'
            raise _bad(needed, "audio", "missing_required_parameter")
        requested, voice = audio.get("format"), voice_name(audio.get("voice"))
        if not isinstance(requested, str) or requested not in FORMATS:
            raise ApiError(
                400, "unsupported_format", f"audio.format: expected one of {', '.join(FORMATS)}", param="audio.format"
            )
        audio_format = requested
    stream = bool(_option(body, "stream", bool, "true or false"))
    stream_options = _option(body, "stream_options", dict, "an object") or {}
    STREAM_OPTIONS_FIELDS.check(stream_options, "stream_options.")
    if stream_options and not stream:
        raise _bad("stream_options: only allowed when stream is true", "stream_options")
    if not isinstance(stream_options.get("include_usage", False), bool):
        raise _bad("stream_options.include_usage: expected true or false", "stream_options.include_usage")
    request_audio = request_allowance(config, speech_positions_per_second)  # checked as each part is decoded
    history, user_turn = await _messages(body.get("messages"), config, store, request_audio)
    logprobs = bool(openai_sampling.get("logprobs"))
    if openai_sampling.get("top_logprobs") and not logprobs:
        raise _bad("top_logprobs: needs logprobs: true", "top_logprobs")
    return ChatRequest(
        history,
        user_turn,
        ChatAnswerForm(output_type, audio_format, voice, logprobs),
        ChatStreaming(stream, bool(stream_options.get("include_usage"))),
        chat_sampling(openai_sampling, config),
        _stop(body.get("stop")),
    )


def _stop(stop) -> tuple[str, ...]:
    """OpenAI's `stop`: a string or a list of up to 4 non-empty strings."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= 4
        or not all(isinstance(s, str) and 0 < len(s) <= 1000 for s in stops)
    ):
        raise _bad("stop: expected a string or a list of 1 to 4 non-empty strings", "stop")
    return tuple(stops)


async def _messages(
    messages, config: Config, store, request_audio: AudioAllowance
) -> tuple[list[HistoryTurn], HistoryTurn]:
    """(the history, the user's turn to answer: the last message's audio, or its text)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: expected a non-empty list of messages", "messages")
    history: list[HistoryTurn] = []
    last_turns: list[HistoryTurn] = []  # the last message's
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(f"{where}: expected a message object", where)
        role = message.get("role")
        if role in ("system", "developer", "user"):
            last_turns = await _user_turns(message.get("content"), f"{where}.content", config, request_audio)
        elif role == "assistant":
            last_turns = [await _assistant_turn(message, where, store)]
        else:
            raise _bad(
                f"{where}.role: expected system, developer, user or assistant, got {str(role)[:40]!r}", f"{where}.role"
            )
        history += last_turns
    where = f"messages[{len(messages) - 1}]"
    if messages[-1].get("role") != "user":
        raise _bad(f"{where}.role: the last message must be the user's (the turn to answer)", f"{where}.role")
    if not last_turns:
        raise _bad(
            f"{where}.content: the last message has nothing to answer (expected text or an input_audio part)",
            f"{where}.content",
        )
    return history[:-1], history[-1]


async def _user_turns(content, where: str, config: Config, request_audio: AudioAllowance) -> list[HistoryTurn]:
    """One message's turns: its text (joined) as a text turn, then its audio parts (joined) as
    one spoken turn. Each part is decoded against what is left of the message's and the
    request's audio allowances: the first part past one is refused, and no later one is read."""
    if isinstance(content, str):
        return [HistoryTurn("user", text=content)] if content else []
    if not isinstance(content, list):
        raise _bad(f"{where}: expected text or a list of content parts", where)
    texts, audio = [], []
    allowances = (message_allowance(config), request_audio)
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise _bad(f"{where}[{j}]: expected a content part object", f"{where}[{j}]")
        if part.get("type") == "text":
            if not isinstance(part.get("text"), str):
                raise _bad(f"{where}[{j}].text: expected text", f"{where}[{j}].text")
            texts.append(part["text"])
        elif part.get("type") == "input_audio":
            spec = part.get("input_audio")
            if not isinstance(spec, dict):
                raise _bad(f'{where}[{j}].input_audio: expected {{"data", "format"}}', f"{where}[{j}].input_audio")
            param = f"{where}[{j}].input_audio"
            audio_format = spec.get("format", "wav")
            check_input_format(audio_format, f"{param}.format")  # before its data is decoded
            audio.append(
                await decoded_speech(
                    decode_base64(spec.get("data"), f"{param}.data"),
                    audio_format,
                    config.audio,
                    f"{param}.data",
                    allowances=allowances,
                )
            )
        else:
            raise ApiError(
                400,
                "unsupported_content",
                f"{where}[{j}].type: {str(part.get('type'))[:40]!r} is not supported (text, input_audio)",
                param=f"{where}[{j}].type",
            )
    turns = [HistoryTurn("user", text="\n".join(texts))] if any(texts) else []
    if audio:
        turns.append(HistoryTurn("user", audio=np.concatenate(audio)))
    return turns


async def _assistant_turn(message: dict, where: str, store) -> HistoryTurn:
    for calls in ("tool_calls", "function_call"):  # another model's history: this one calls none
        if message.get(calls):
            raise ApiError(
                400,
                "unsupported_content",
                f"{where}.{calls}: kimiaudio has no function calling, so no history of calls",
                param=f"{where}.{calls}",
            )
    audio = message.get("audio")
    if audio is not None:
        if not isinstance(audio, dict) or not isinstance(audio.get("id"), str):
            raise _bad(f'{where}.audio: expected {{"id": "<id of an earlier answer>"}}', f"{where}.audio")
        answer = await load_answer(store, audio["id"])
        if answer is None:
            raise _bad(
                f"{where}.audio.id: no answer {audio['id'][:60]!r} on this server (unknown or expired)",
                f"{where}.audio.id",
                "audio_not_found",
            )
        return HistoryTurn("assistant", text=answer.text, audio_tokens=answer.audio_tokens)
    content = message.get("content")
    if isinstance(content, list):  # text parts, and refusals (what the assistant said, as text)
        strings = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get(kind) if kind in ("text", "refusal") else None
            if not isinstance(text, str):
                raise _bad(
                    f'{where}.content[{j}]: expected a text part {{"type": "text", "text": "..."}} (or a refusal)',
                    f"{where}.content[{j}]",
                )
            strings.append(text)
        content = "".join(strings)
    if not isinstance(content, str):
        raise _bad(f"{where}.content: expected text (or an audio id)", f"{where}.content")
    return HistoryTurn("assistant", text=content)
