"""The real-time server: the aiohttp app and its routes; gate/ (where requests enter), session/
(one conversation, the event protocol), transport/ (WebRTC, WebSocket), observe/ (metrics, logs),
v1/ (the OpenAI-compatible routes)."""
