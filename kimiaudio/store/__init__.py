"""Conversation storage (SQLite through sqlite-utils); the rest of the code reaches it only here."""

from kimiaudio.store.conversation_store import ConversationStore, StoredTurn
from kimiaudio.store.schema import SCHEMA_VERSION, open_database

__all__ = ["ConversationStore", "StoredTurn", "SCHEMA_VERSION", "open_database"]
