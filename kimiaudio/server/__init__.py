"""The real-time server: the aiohttp app and its routes; middleware/ (where requests enter:
errors, access, admission, body limits), inputs/ (JSON, path parameters, SDP checks), session/
(one conversation, the event protocol), transport/ (WebRTC, WebSocket), observe/ (metrics, logs),
v1/ (the OpenAI-compatible routes)."""
