"""The client events about conversation items, parsed and validated: conversation.item.create,
.truncate, .retrieve and .delete (client_events.py reads the other events and hands these here),
and the items of an out-of-band response.create's `input`: message items as an item.create
takes them, or references to the conversation's items (`item_reference`).

A message item is stored as one turn: one text (its text parts joined) and at most one audio.
The parts keep the order the client gave them, so an item's text parts all come before its
input_audio part or all after it (`audio_first`); text on both sides of the audio is refused,
as a turn cannot hold it. An assistant's audio part (GA output_audio, beta audio) is its
transcript: an answer is prompted as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimiaudio.server.session.event_fields import ProtocolError, decode_pcm16, object_field, typed_field


@dataclass(frozen=True)
class ItemCreate:
    role: str  # "user" | "assistant" | "system"
    text: str = ""
    pcm16: bytes | None = None  # user audio at the session's input rate
    item_id: str | None = None
    previous_item_id: str | None = None  # None: appended at the end; "root": the first item
    audio_first: bool = False  # its text parts follow its audio (False: they come before it, or there is none)


@dataclass(frozen=True)
class ItemTruncate:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class ItemRetrieve:
    item_id: str


@dataclass(frozen=True)
class ItemDelete:
    item_id: str


@dataclass(frozen=True)
class ItemReference:
    item_id: str  # an item of the conversation, by its id


ItemEvent = ItemCreate | ItemTruncate | ItemRetrieve | ItemDelete
InputItem = ItemCreate | ItemReference
ITEM_EVENT_TYPES = (
    "conversation.item.create",
    "conversation.item.truncate",
    "conversation.item.retrieve",
    "conversation.item.delete",
)


def parse_item_event(data: dict, kind: str) -> ItemEvent:
    """The event `data` of one of ITEM_EVENT_TYPES, `kind`."""
    if kind == "conversation.item.create":
        previous = typed_field(data, "previous_item_id", str, kind, "an item id")
        if previous == "":
            where = f"{kind}.previous_item_id"
            raise ProtocolError("invalid_value", f"{where}: expected an item id", where)
        return _item_create(object_field(data.get("item"), "item"), "item", previous)
    item_id = typed_field(data, "item_id", str, kind, "an item id")
    if not item_id:
        raise ProtocolError("missing_required_parameter", f"{kind}: item_id is required", "item_id")
    if kind == "conversation.item.truncate":
        return _item_truncate(data, kind, item_id)
    return ItemRetrieve(item_id) if kind == "conversation.item.retrieve" else ItemDelete(item_id)


def parse_input_items(value: Any, where: str) -> tuple[InputItem, ...]:
    """A response.create's `input`: message items and item references, in order."""
    if not isinstance(value, list):
        raise ProtocolError("invalid_value", f"{where}: expected a list of items", where)
    items: list[InputItem] = []
    for i, raw in enumerate(value):
        item = object_field(raw, f"{where}[{i}]")
        if item.get("type") == "item_reference":
            item_id = typed_field(item, "id", str, f"{where}[{i}]", "an item id")
            if not item_id:
                raise ProtocolError("missing_required_parameter", f"{where}[{i}].id is required", f"{where}[{i}].id")
            items.append(ItemReference(item_id))
        else:
            items.append(_item_create(item, f"{where}[{i}]", None))
    return tuple(items)


def _item_truncate(data: dict, kind: str, item_id: str) -> ItemTruncate:
    end_ms = typed_field(data, "audio_end_ms", int, kind, "milliseconds (an integer >= 0)")
    if end_ms is None:
        raise ProtocolError("missing_required_parameter", f"{kind}: audio_end_ms is required", "audio_end_ms")
    if end_ms < 0:
        raise ProtocolError("invalid_value", f"{kind}.audio_end_ms: expected an integer >= 0", f"{kind}.audio_end_ms")
    if typed_field(data, "content_index", int, kind, "an integer") not in (None, 0):
        raise ProtocolError(
            "invalid_value",
            f"{kind}.content_index: an assistant item has one content part, its audio: 0",
            f"{kind}.content_index",
        )
    return ItemTruncate(item_id, end_ms)


def _item_create(item: dict, where: str, previous_item_id: str | None) -> ItemCreate:
    if item.get("type", "message") != "message":
        raise ProtocolError(
            "unsupported",
            f"{where}.type: only message items are supported, got {item.get('type')!r}"[:200],
            f"{where}.type",
        )
    role = item.get("role")
    if role not in ("user", "assistant", "system"):
        raise ProtocolError(
            "invalid_value", f"{where}.role: expected user, assistant or system, got {role!r}"[:200], f"{where}.role"
        )
    content = item.get("content") or []
    if not isinstance(content, list):
        raise ProtocolError("invalid_value", f"{where}.content: expected a list of content parts", f"{where}.content")
    texts, audio, texts_before_audio = [], None, 0
    for i, part in enumerate(content):
        part = object_field(part, f"{where}.content[{i}]")
        if part.get("type") in ("input_text", "text", "output_text"):
            texts.append(_text(part, "text", f"{where}.content[{i}]"))
        elif part.get("type") in ("output_audio", "audio") and role == "assistant":
            # What the assistant said, as a client replaying a conversation sends it: its words
            # (the audio it may carry beside them is not kept: an answer is prompted as text).
            texts.append(_text(part, "transcript", f"{where}.content[{i}]"))
        elif part.get("type") == "input_audio" and role == "user":
            if audio is not None:
                raise ProtocolError(
                    "invalid_value", f"{where}.content: at most one input_audio part", f"{where}.content"
                )
            audio = decode_pcm16(part.get("audio"), f"{where}.content[{i}].audio")
            texts_before_audio = len(texts)
        else:
            raise ProtocolError(
                "unsupported",
                f"{where}.content[{i}].type: {part.get('type')!r} is not supported here"[:200],
                f"{where}.content[{i}].type",
            )
    # A user or system item of empty text would be a turn with nothing to answer: the next
    # response.create would fail (no_user_turn) over an item the client was told was added.
    # An assistant's may be empty (a replayed answer cut before any of it was said).
    if audio is None and (not texts or (role != "assistant" and not "".join(texts))):
        raise ProtocolError("invalid_value", f"{where}.content: no text or audio", f"{where}.content")
    if audio is not None and 0 < texts_before_audio < len(texts):
        raise ProtocolError(
            "unsupported",
            f"{where}.content: text parts go all before or all after the input_audio part "
            "(an item is stored as one text and one audio, in that order or the other)",
            f"{where}.content",
        )
    item_id = typed_field(item, "id", str, where, "a string")
    if item_id == "":
        raise ProtocolError("invalid_value", f"{where}.id: expected a non-empty string", f"{where}.id")
    audio_first = audio is not None and bool(texts) and texts_before_audio == 0
    return ItemCreate(role, "\n".join(texts), audio, item_id, previous_item_id, audio_first)


def _text(part: dict, key: str, where: str) -> str:
    """A content part's text (`key`: text, or an assistant audio part's transcript)."""
    text = typed_field(part, key, str, where, "text")
    if text is None:
        raise ProtocolError(
            "missing_required_parameter", f"{where}.{key} is required (a {part['type']} part's {key})", f"{where}.{key}"
        )
    if "\x00" in text:  # (PostgreSQL stores no NUL: the turn would be lost)
        raise ProtocolError("invalid_value", f"{where}.{key}: expected text without NUL characters", f"{where}.{key}")
    return text
