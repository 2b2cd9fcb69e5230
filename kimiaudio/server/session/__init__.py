"""One client's conversation whatever carries it: the Realtime session, its responses, settings, stored
conversation, and the event protocol (server events out, client events in)."""
