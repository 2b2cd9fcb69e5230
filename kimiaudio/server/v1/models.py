"""GET /v1/models, and the one model id the /v1 routes answer to.

The server serves one model. Requests name it as `kimi-audio-7b-instruct` (any case, with or
without the `moonshotai/` prefix, as Hugging Face spells it); any other name is a 404
model_not_found, as OpenAI answers it. The demo checkpoint answers to the same id (GET
/api/status says when the weights are the demo's).
"""

from __future__ import annotations

import time

from aiohttp import web

from kimiaudio.server.api_error import ApiError

MODEL_ID = "kimi-audio-7b-instruct"
_CREATED = int(time.time())


def check_model(model, param: str = "model") -> str:
    """The served model id for a request's `model`; ApiError if it names another model."""
    if model is None or model == "":
        raise ApiError(400, "missing_required_parameter", f"{param} is required (this server serves {MODEL_ID!r})",
                       param=param)
    if not isinstance(model, str) or model.lower().removeprefix("moonshotai/") != MODEL_ID:
        raise ApiError(404, "model_not_found",
                       f"the model {str(model)[:100]!r} does not exist; this server serves {MODEL_ID!r}", param=param)
    return MODEL_ID


async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [
        {"id": MODEL_ID, "object": "model", "created": _CREATED, "owned_by": "moonshotai"}]})
