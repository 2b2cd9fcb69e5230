"""POST /v1/realtime/client_secrets: an ephemeral Realtime key, for an app's backend to hand its
browser (OpenAI's `client.realtime.client_secrets.create`), and the beta API's POST
/v1/realtime/sessions (`client.beta.realtime.sessions.create`) and POST
/v1/realtime/transcription_sessions (`client.beta.realtime.transcription_sessions.create`),
which mint one with the session. Only the server's API key mints one (an ephemeral key cannot:
middleware/issued_keys.py); what it mints is in ephemeral_keys.py."""

from __future__ import annotations

from aiohttp import web

from kimiaudio.server.context import server_context
from kimiaudio.server.ephemeral_keys import (
    MAX_BODY_BYTES,
    create_beta_session,
    create_beta_transcription_session,
    create_client_secret,
)
from kimiaudio.server.inputs.json_input import read_json_object


async def client_secrets(request: web.Request) -> web.Response:
    body = await read_json_object(request, MAX_BODY_BYTES)
    return web.json_response(await create_client_secret(server_context(request), body))


async def beta_sessions(request: web.Request) -> web.Response:
    body = await read_json_object(request, MAX_BODY_BYTES)
    return web.json_response(await create_beta_session(server_context(request), body))


async def beta_transcription_sessions(request: web.Request) -> web.Response:
    body = await read_json_object(request, MAX_BODY_BYTES)
    return web.json_response(await create_beta_transcription_session(server_context(request), body))
