"""What a response asks of the pipeline: the turn answering the newest user turn of the
conversation, with the session's settings and those of the response.create that asked for it.

The newest stored turn must be the user's, spoken or written (a text item: answered as the
official prompt answers a user text message); the conversation before it is the history, led
by the instructions as a user text message. A user item with text parts and audio is stored as
one turn (its text: the parts joined) and prompted as two user messages in the order the client
gave them: its text, then its speech (the official layout of an instruction and the speech it
is about, as /v1/chat/completions prompts a message's parts), or its speech, then its text
(answered as a written turn, its speech the history's last message). The output type, voice
and sampling are the session's unless the response.create names its own. A conversation that
outgrows the model's context loses its oldest turns from the prompt, never the instructions,
as the session's truncation says (pipeline/turn_prompt.py; "disabled": it is refused). What
cannot be answered is a ProtocolError naming why: the Responder ends that response failed
(responder.py). Here too: the response object its response.created announces.
"""

from __future__ import annotations

import dataclasses

from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.turn_prompt import Truncation
from kimiaudio.pipeline.turn_request import HistoryTurn, TurnRequest
from kimiaudio.server.session import response_events
from kimiaudio.server.session.client_events import ResponseCreate
from kimiaudio.server.session.conversation import Conversation
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.session_settings import SessionSettings
from kimiaudio.server.session.session_update import SessionTruncation


async def answer_request(
    settings: SessionSettings, conversation: Conversation, request: ResponseCreate | None
) -> tuple[int, HistoryTurn, TurnRequest]:
    """(the index of the newest user turn, that turn, the pipeline turn answering it);
    `request`: the response.create (None: a turn the server's VAD committed)."""
    if settings.kind == "transcription":
        raise ProtocolError(
            "transcription_session",
            'response.create: a transcription session (session.type "transcription") generates no responses',
        )
    last = await conversation.last_turn() if conversation.id is not None else None
    index, user_turn = last if last is not None else (-1, None)
    if user_turn is None or user_turn.role != "user" or (user_turn.audio is None and not user_turn.text):
        raise ProtocolError(
            "no_user_turn",
            "response.create: the conversation does not end with a user turn to answer "
            "(add a user message item, spoken or text, or commit the input audio buffer first)",
        )
    earlier = list((await conversation.history()).items())[:-1]
    history = [part for i, turn in earlier for part in prompted(turn, conversation.audio_first(i))]
    # A turn of text and speech is answered as its last part; its first closes the history.
    *first, answered = prompted(user_turn, conversation.audio_first(index))
    history += first
    instructions = request.instructions if request and request.instructions is not None else settings.instructions
    if instructions:
        history.insert(0, HistoryTurn("user", text=instructions))
    output_type = settings.answer_type(request.output_type if request else None)
    named = request.voice if request else None
    if output_type == "both":
        await settings.fetch_voice(named)
    try:
        voice = settings.voice_prompt(named) if output_type == "both" else None
    except KimiAudioError as exc:  # an unknown name, or its voice was deleted meanwhile
        raise ProtocolError("unknown_voice", f"response.create: {exc}", "response.voice") from None
    sampling = settings.sampling(
        output_type, request.temperature if request else None, request.max_new_tokens if request else None
    )
    turn = TurnRequest(
        conversation_id=conversation.stored_id,
        history=history,
        user_audio=answered.audio,
        user_text=answered.text if answered.audio is None else None,
        sampling=sampling,
        output_type=output_type,
        voice=voice,
        truncation=truncation_of(settings.truncation, 1 if instructions else 0, len(first) + 1),
        playback_speed=settings.speed,
    )
    return index, user_turn, turn


def announced(
    settings: SessionSettings,
    conversation_id: str | None,
    request: ResponseCreate | None,
    response_id: str,
    output_type: str,
) -> dict:
    """The response object response.created sends: the response.create's voice, length limit
    and metadata (echoed as OpenAI echoes them), or the session's."""
    max_new_tokens = request.max_new_tokens if request else None
    limit = settings.sampling(output_type, None, max_new_tokens).max_new_tokens
    voice = (request.voice if request else None) or settings.voice
    metadata = request.metadata if request else None
    return response_events.response_object(response_id, conversation_id, output_type == "both", voice, limit, metadata)


def truncation_of(setting: SessionTruncation, pinned: int, tail: int) -> Truncation | None:
    """How a turn's history may be cut under the session's truncation: never its first `pinned`
    messages (the instructions) nor its last `tail` (the item answered)."""
    if setting.kind == "disabled":
        return None
    return Truncation(pinned, setting.retention_ratio, setting.post_instructions, tail)


def prompted(turn: HistoryTurn, audio_first: bool) -> list[HistoryTurn]:
    """A stored turn as the prompt's history takes it: a user turn with text and audio as two
    messages, its text message and its speech, in the order the client gave them."""
    if turn.role == "user" and turn.audio is not None and turn.text:
        parts = [HistoryTurn("user", text=turn.text), dataclasses.replace(turn, text="")]
        return parts[::-1] if audio_first else parts
    return [turn]
