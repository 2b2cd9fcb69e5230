"""Multipart form bodies (POST /api/voices, POST /v1/audio/transcriptions), read with limits.

One reader for every form route, so each refuses the same faults the same way:
- not multipart/form-data: 415 unsupported_media_type;
- a form aiohttp cannot parse: 400 invalid_multipart;
- a field larger than its limit: 413 too_large (each field is read in chunks and cut at its
  limit: a chunked body has no Content-Length for the app's body limit to check first);
- a required field missing or empty: 400 missing_required_parameter naming it (`param`);
- a text field that is not UTF-8: 400 invalid_value naming it.
Fields the route does not name are skipped unread (their names are reported to a route that
asks, to refuse them); a repeated field keeps its first value, unless the route takes a list
there (OpenAI's `name[]` fields): then every value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from kimiaudio.server.api_error import ApiError

CHUNK_BYTES = 1 << 16
MAX_TEXT_BYTES = 64 * 1024  # a text field (a name, a prompt, a flag): far more than any needs
MAX_LIST_VALUES = 16  # values of a list field; unknown names reported


@dataclass(frozen=True)
class FormField:
    name: str
    data: bytes
    filename: str | None  # set for a file part
    more: list[bytes] = field(default_factory=list)  # a list field's later values

    def text(self, data: bytes | None = None) -> str:
        try:
            return (self.data if data is None else data).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_value", f"{self.name}: expected UTF-8 text", param=self.name) from None

    def texts(self) -> list[str]:
        """Every value of a list field."""
        return [self.text(data) for data in [self.data, *self.more]]


async def read_form(
    request: web.Request,
    limits: dict[str, int],
    required: tuple[str, ...],
    expected: str,
    lists: tuple[str, ...] = (),
    unknown: list[str] | None = None,
) -> dict[str, FormField]:
    """The fields named in `limits` (name -> most bytes), each at most its limit; `expected`
    says what the form should hold, for the errors' messages. `lists`: fields that may repeat
    (each value at most the limit, MAX_LIST_VALUES of them); `unknown` gets the other names."""
    if not request.content_type.startswith("multipart/form-data"):
        raise ApiError(
            415,
            "unsupported_media_type",
            f"expected a multipart/form-data body with {expected} (got {request.content_type or 'none'})",
        )
    fields: dict[str, FormField] = {}
    try:
        async for part in await request.multipart():
            name = part.name if isinstance(part, BodyPartReader) else None  # (a nested multipart part has none)
            if not isinstance(part, BodyPartReader) or name is None or name not in limits:
                if unknown is not None and name not in unknown and len(unknown) < MAX_LIST_VALUES:
                    unknown.append(str(name)[:100])
                continue
            if name in fields and name not in lists:
                continue
            limit, data = limits[name], bytearray()
            while chunk := await part.read_chunk(CHUNK_BYTES):
                data += chunk
                if len(data) > limit:
                    raise ApiError(413, "too_large", f"field `{name}` is larger than {limit} bytes")
            if name not in fields:
                fields[name] = FormField(name, bytes(data), part.filename)
            elif len(fields[name].more) + 1 < MAX_LIST_VALUES:
                fields[name].more.append(bytes(data))
            else:
                raise ApiError(400, "invalid_value", f"field `{name}`: at most {MAX_LIST_VALUES} values", param=name)
    # aiohttp's words for a broken form (HttpProcessingError: a line longer than it reads, e.g. a
    # body with no boundary in its first 512 KiB)
    except (ValueError, AssertionError, UnicodeDecodeError, HttpProcessingError) as exc:
        raise ApiError(400, "invalid_multipart", f"the multipart form could not be read ({exc})") from None
    missing = [name for name in required if name not in fields]
    if missing:
        raise ApiError(
            400,
            "missing_required_parameter",
            f"missing form field(s): {', '.join(missing)} (expected {expected})",
            param=missing[0],
        )
    for name in required:
        if not fields[name].data:  # (a file chosen and sent, with nothing in it)
            raise ApiError(400, "invalid_value", f"form field `{name}` is empty (expected {expected})", param=name)
    return fields
