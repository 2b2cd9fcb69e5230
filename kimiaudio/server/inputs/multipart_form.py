"""Multipart form bodies (POST /api/voices, POST /v1/audio/transcriptions), read with limits.

One reader for every form route, so each refuses the same faults the same way:
- not multipart/form-data: 415 unsupported_media_type;
- a form aiohttp cannot parse: 400 invalid_multipart;
- a field larger than its limit: 413 too_large (each field is read in chunks and cut at its
  limit: a chunked body has no Content-Length for the app's body limit to check first);
- a required field missing or empty: 400 missing_required_parameter naming it (`param`);
- a text field that is not UTF-8: 400 invalid_value naming it.
Fields the route does not name are skipped unread; a repeated field keeps its first value.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from kimiaudio.server.api_error import ApiError

CHUNK_BYTES = 1 << 16
MAX_TEXT_BYTES = 64 * 1024  # a text field (a name, a prompt, a flag): far more than any needs


@dataclass(frozen=True)
class FormField:
    name: str
    data: bytes
    filename: str | None  # set for a file part

    def text(self) -> str:
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_value", f"{self.name}: expected UTF-8 text", param=self.name) from None


async def read_form(request: web.Request, limits: dict[str, int], required: tuple[str, ...],
                    expected: str) -> dict[str, FormField]:
    """The fields named in `limits` (name -> most bytes), each at most its limit; `expected`
    says what the form should hold, for the errors' messages."""
    if not request.content_type.startswith("multipart/form-data"):
        raise ApiError(415, "unsupported_media_type", f"expected a multipart/form-data body with {expected} "
                       f"(got {request.content_type or 'none'})")
    fields: dict[str, FormField] = {}
    try:
        async for part in await request.multipart():
            name = getattr(part, "name", None)  # (a nested multipart part has none)
            if name not in limits or name in fields:
                continue
            limit, data = limits[name], bytearray()
            while chunk := await part.read_chunk(CHUNK_BYTES):
                data += chunk
                if len(data) > limit:
                    raise ApiError(413, "too_large", f"field `{name}` is larger than {limit} bytes")
            fields[name] = FormField(name, bytes(data), part.filename)
    except (ValueError, AssertionError, UnicodeDecodeError) as exc:  # aiohttp's word for a broken form
        raise ApiError(400, "invalid_multipart", f"the multipart form could not be read ({exc})") from None
    missing = [name for name in required if name not in fields or not fields[name].data]
    if missing:
        raise ApiError(400, "missing_required_parameter", f"missing form field(s): {', '.join(missing)} "
                       f"(expected {expected})", param=missing[0])
    return fields
