"""Conversation storage (SQLite through sqlite-utils); the rest of the code reaches it only here."""

from kimiaudio.store.conversation_store import ConversationStore, StoredTurn
from kimiaudio.store.identifiers import MAX_TURN_INDEX, is_conversation_id, is_turn_index
from kimiaudio.store.schema import SCHEMA_VERSION, open_database

__all__ = ["ConversationStore", "StoredTurn", "SCHEMA_VERSION", "open_database", "MAX_TURN_INDEX",
           "is_conversation_id", "is_turn_index"]
