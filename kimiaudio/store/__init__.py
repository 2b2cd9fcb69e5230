"""Conversation storage (SQLite through sqlite-utils, or a shared PostgreSQL database); the rest of
the code reaches it only here."""

from kimiaudio.store.conversation_rows import as_stored
from kimiaudio.store.conversation_store import ConversationStore, StoredTurn
from kimiaudio.store.identifiers import MAX_TURN_INDEX, is_conversation_id, is_turn_index
from kimiaudio.store.leases import ConversationBusyError, ConversationLostError, ConversationNotFoundError
from kimiaudio.store.location import DATABASE_URL_ENV, database_location
from kimiaudio.store.schema import SCHEMA_VERSION, open_database
from kimiaudio.store.turn_by_index import delete_turn, get_turn

__all__ = [
    "as_stored",
    "ConversationStore",
    "StoredTurn",
    "get_turn",
    "delete_turn",
    "SCHEMA_VERSION",
    "open_database",
    "MAX_TURN_INDEX",
    "is_conversation_id",
    "is_turn_index",
    "ConversationBusyError",
    "ConversationNotFoundError",
    "ConversationLostError",
    "DATABASE_URL_ENV",
    "database_location",
]
