"""GET /v1/models, and the one model id the /v1 routes answer to.

The server serves one model. Requests name it as `kimi-audio-7b-instruct` (any case, with or
without the `moonshotai/` prefix, as Hugging Face spells it) or by one of [server]
model_aliases (by default OpenAI's transcription, audio chat and realtime model names, so
OpenAI's examples run unchanged); /v1/models lists them all. Any other name is a 404
model_not_found, as OpenAI answers it. The demo checkpoint answers to the same id (GET
/api/status says when the weights are the demo's).
"""

from __future__ import annotations

import time

from aiohttp import web

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.app_keys import config_key

MODEL_ID = "kimi-audio-7b-instruct"
_CREATED = int(time.time())


def check_model(model, aliases=(), param: str = "model") -> str:
    """The served model id for a request's `model` (the id or one of `aliases`); ApiError if it
    names another model."""
    if model is None or model == "":
        raise ApiError(
            400, "missing_required_parameter", f"{param} is required (this server serves {MODEL_ID!r})", param=param
        )
    if not isinstance(model, str) or (model.lower().removeprefix("moonshotai/") != MODEL_ID and model not in aliases):
        raise ApiError(
            404,
            "model_not_found",
            f"the model {str(model)[:100]!r} does not exist; this server serves {MODEL_ID!r}",
            param=param,
        )
    return MODEL_ID


async def list_models(request: web.Request) -> web.Response:
    names = [MODEL_ID, *dict.fromkeys(request.app[config_key].server.model_aliases)]
    return web.json_response(
        {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": _CREATED, "owned_by": "moonshotai"} for name in names],
        }
    )
