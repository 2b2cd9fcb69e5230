"""The real-time server: aiohttp app, WebRTC sessions, outgoing audio track, event protocol."""
